OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> v = expected_group_variance(4, 0.5, 0.9, 0.2)\n'
                                               ">>> assert isinstance(v, float), f'expected_group_variance returns a Python float: got {type(v).__name__}'\n"
                                               ">>> assert 0.0 <= v <= 0.25, f'the population variance of binary rewards lies in [0, 1/4]: got {v}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
