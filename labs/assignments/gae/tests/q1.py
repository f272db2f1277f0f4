OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> out = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), gamma=1.0, lam=1.0)\n'
                                               ">>> assert isinstance(out, tuple) and len(out) == 2, 'gae returns a pair (advantages, returns)'\n"
                                               ">>> assert out[0].shape == (1, 2), f'the advantages have shape [B, T]: got {tuple(out[0].shape)}'\n"
                                               ">>> assert torch.allclose(out[0], torch.tensor([[0.5, 0.5]])), f'reward 1 at the end, V = 0.5 everywhere, gamma = lam = 1: the advantages are 1 - 0.5 "
                                               "= 0.5, got {out[0].tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
