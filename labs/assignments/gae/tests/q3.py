OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> out = value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))\n'
                                               ">>> assert isinstance(out, torch.Tensor) and out.numel() == 1, 'value_loss returns a scalar tensor'\n"
                                               ">>> assert abs(out.item() - 0.5) < 1e-06, f'predictions 0 that did not move, targets 1: the loss is 0.5 * 1 = 0.5, got {out.item()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
