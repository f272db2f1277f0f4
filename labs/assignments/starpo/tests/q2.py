OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': ">>> out = distinct_per_group(['a', 'b', 'a', 'c', 'c'], torch.tensor([0, 0, 0, 1, 1]))\n"
                                               ">>> assert isinstance(out, float), f'distinct_per_group returns a Python float: got {type(out).__name__}'\n"
                                               ">>> assert out == 1.5, f'groups with 2 and 1 distinct strings give (2 + 1) / 2 = 1.5: got {out}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
