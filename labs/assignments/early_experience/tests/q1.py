OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> out = keep_alternatives('go to fridge', 'at fridge : potato', [('go to fridge', 'at fridge : potato'), ('look', 'at middle'), ('look', 'at "
                                               "middle'), ('go to shelf', 'at shelf : empty')], 2)\n"
                                               ">>> assert [tuple(p) for p in out] == [('look', 'at middle'), ('go to shelf', 'at shelf : empty')], f'keep the first 2 proposals with a new action: "
                                               "expected look and go to shelf, got {out!r}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
