OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> out = aggregate(torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 1, 1]]), 'token-mean')\n"
                                               ">>> assert isinstance(out, torch.Tensor) and out.numel() == 1, 'aggregate returns a scalar tensor'\n"
                                               ">>> assert abs(out.item() - 1.0) < 1e-06, f'a loss of 1 on every token averages to 1: got {out.item()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
