OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> labels = judgement_labels([True, False], [2, 1], [0.5, -0.5], 'outcome')\n"
                                               ">>> assert isinstance(labels, list), f'judgement_labels returns a list: got {type(labels).__name__}'\n"
                                               '>>> assert labels == [(0, 0, True), (0, 1, True), (1, 0, False)], f"a solved episode of 2 actions and a failed one of 1, rule \'outcome\': got '
                                               '{labels}"\n',
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
