OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> keep = reward_std_filter(torch.tensor([1.0, 1.1, 5.0, 5.0, 10.0, 20.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))\n'
                                               ">>> assert isinstance(keep, torch.Tensor) and keep.dtype == torch.bool, 'reward_std_filter returns a torch.bool tensor'\n"
                                               ">>> assert keep.shape == (8,), f'one entry per row: got shape {tuple(keep.shape)}'\n"
                                               ">>> assert keep.tolist() == [False] * 4 + [True] * 2 + [False] * 2, f'top_k 0.25 of the worked example keeps group 2 (rows 4 and 5) only: got "
                                               "{keep.tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
