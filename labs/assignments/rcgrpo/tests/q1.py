OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> tokens = draw_conditions(3, 4, 0.5, 'split', random.Random(0))\n"
                                               ">>> assert isinstance(tokens, list) and len(tokens) == 12, f'one token per rollout, 3 * 4 = 12: got {tokens!r}'\n"
                                               ">>> assert all((isinstance(t, bool) for t in tokens)), f'the tokens are Python bools: got {tokens}'\n"
                                               '>>> assert [sum(tokens[i:i + 4]) for i in (0, 4, 8)] == [2, 2, 2], f"\'split\' at p_high 0.5 puts 2 high tokens in every group of 4: got {tokens}"\n',
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
