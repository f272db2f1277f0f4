OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> row = world_model_row('at middle <action>', 'go to shelf', 'at shelf : empty')\n"
                                               ">>> assert isinstance(row, (list, tuple)) and all((len(s) == 2 for s in row)), f'a row is a list of (text, trainable) pairs: got {row!r}'\n"
                                               ">>> trained = ' '.join((text for text, trainable in row if trainable)).split()\n"
                                               ">>> assert trained == ['at', 'shelf', ':', 'empty'], f'only the next state is trainable: the trainable words are {trained}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
