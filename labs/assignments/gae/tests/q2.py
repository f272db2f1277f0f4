OK_FORMAT = True

test = {   'name': 'q2',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> out = masked_whiten(torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[1, 1, 0]]))\n'
                                               ">>> assert out.shape == (1, 3), f'masked_whiten keeps the shape: got {tuple(out.shape)}'\n"
                                               ">>> assert abs(out[0, 0].item() + out[0, 1].item()) < 1e-06, f'the mask-1 positions have mean 0: got {out.tolist()}'\n"
                                               ">>> assert out[0, 2].item() == 0, f'a masked position returns 0: got {out[0, 2].item()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
