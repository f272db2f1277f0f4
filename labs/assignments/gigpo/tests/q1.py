OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> out = list(discounted_returns([0, 0, 1, 0, 1], [0, 0, 0, 1, 1], 0.5))\n'
                                               ">>> assert len(out) == 5, f'one return per row: got {len(out)} values'\n"
                                               ">>> assert all((abs(a - b) < 1e-09 for a, b in zip(out, [0.25, 0.5, 1, 0.5, 1]))), f'two episodes (0, 0, 1) and (0, 1), gamma 0.5, give 0.25, 0.5, 1, "
                                               "0.5, 1: got {out}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
