OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4))\n'
                                               ">>> assert adv.shape == (4,), f'the advantages have shape [B]: got {tuple(adv.shape)}'\n"
                                               ">>> assert torch.allclose(adv.abs(), torch.full((4,), 0.866), atol=0.001), f'rewards (1, 0, 0, 1) in one group give +-0.866 (unbiased std): got "
                                               "{adv.tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
