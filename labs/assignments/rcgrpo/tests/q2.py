OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> frac = zero_std_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))\n'
                                               ">>> assert isinstance(frac, float), f'zero_std_fraction returns a Python float: got {type(frac).__name__}'\n"
                                               ">>> assert abs(frac - 0.5) < 1e-12, f'groups (1, 1) and (0, 1): one of the two is all equal, 0.5: got {frac}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
