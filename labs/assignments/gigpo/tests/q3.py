OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> out = gigpo_advantages([1, 0], ['a', 'b'], [0, 0], [0, 1], gamma=0.9, omega=1.0)\n"
                                               ">>> assert len(out) == 3, 'gigpo_advantages returns (episode_level, step_level, combined)'\n"
                                               ">>> assert [round(float(x), 6) for x in out[0]] == [0.5, -0.5], f'two one-step episodes with returns 1 and 0: episode level +0.5 and -0.5, got "
                                               "{out[0]}'\n"
                                               ">>> assert [float(x) for x in out[1]] == [0.0, 0.0], f'no state recurs, so the step level is 0: got {out[1]}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
