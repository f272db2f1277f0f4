OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> rows = resample_on_correct(torch.tensor([1.0, -1, 1, -1]), torch.ones(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), 2, '
                                               'torch.Generator().manual_seed(0))\n'
                                               ">>> assert isinstance(rows, torch.Tensor) and rows.dtype == torch.long, 'a torch.long tensor of row indices'\n"
                                               ">>> assert len(rows) == 2 and rows.tolist() == sorted(set(rows.tolist())), f'keep=2 distinct rows, sorted: got {rows.tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
