OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> value = risky_advantage_weight(0.5, 0.4)\n'
                                               ">>> assert isinstance(value, float), f'risky_advantage_weight returns a Python float: got {type(value).__name__}'\n"
                                               ">>> assert abs(value - -0.1) < 1e-12, f'q 0.5, r 0.4 with the expected reward as baseline gives q r (q - 1) = -0.1: got {value}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
