OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> out = expected_bandit_gradient(0.5, 4, samples=2000)\n'
                                               ">>> assert isinstance(out, float), f'expected_bandit_gradient returns a Python float: got {type(out).__name__}'\n"
                                               ">>> assert np.isfinite(out), f'the estimate must be finite: got {out}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
