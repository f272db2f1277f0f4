OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> from collections import namedtuple\n'
                                               ">>> _Step = namedtuple('_Step', 'state action next_state kind')\n"
                                               ">>> row = reflection_row(_Step('at middle <action>', 'look', 'at middle', 'flawed'), _Step('at middle <action>', 'go to shelf', 'at shelf : empty', "
                                               "'flawed'))\n"
                                               ">>> assert isinstance(row, (list, tuple)) and all((len(s) == 2 for s in row)), f'a row is a list of (text, trainable) pairs: got {row!r}'\n"
                                               ">>> trained = ' '.join(' '.join((text for text, trainable in row if trainable)).split())\n"
                                               '>>> assert trained.startswith(\'look </action> think : go to shelf gives at shelf : empty , no closer ;\'), f"the expert\'s action, its stop word, '
                                               'then the rationale are trained: got {trained!r}"\n',
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
