OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> z = torch.zeros(1, 2)\n'
                                               '>>> out = clipped_token_loss(z, z, torch.ones(1, 2))\n'
                                               ">>> assert out.shape == (1, 2), f'one loss per token: got shape {tuple(out.shape)}'\n"
                                               ">>> assert torch.allclose(out, -torch.ones(1, 2)), f'at ratio 1 with A = 1 the loss is -1 per token: got {out.tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
