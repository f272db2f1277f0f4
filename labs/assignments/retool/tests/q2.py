OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> q = torch.zeros(10, dtype=torch.float64)\n'
                                               '>>> q[6] = 1.0\n'
                                               '>>> out = spurious_logit_gradient(torch.zeros(10, dtype=torch.float64), q)\n'
                                               ">>> assert isinstance(out, torch.Tensor) and out.shape == (10,), 'one value per logit, shape [V]'\n"
                                               ">>> assert abs(out[6].item() - 0.9) < 1e-09 and abs(out[0].item() + 0.1) < 1e-09, f'uniform logits and a tool that writes 6: +0.9 on 6, -0.1 "
                                               "elsewhere; got {out.tolist()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
