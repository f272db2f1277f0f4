OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> step_group, sizes = anchor_groups(['S', 'A', 'S'], [0, 0, 0])\n"
                                               ">>> assert [int(x) for x in step_group] == [0, 1, 0], f'anchors S, A, S in one group are step groups 0, 1, 0: got {step_group}'\n"
                                               ">>> assert [int(x) for x in sizes] == [2, 1, 2], f'S is visited twice, A once: sizes 2, 1, 2, got {sizes}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
