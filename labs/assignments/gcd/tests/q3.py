OK_FORMAT = True

test = {   'name': 'q3',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> cos = gradient_cosine(torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[2.0, 4.0, 0.0]]))\n'
                                               ">>> assert isinstance(cos, torch.Tensor) and cos.shape == (1,), 'one cosine per pair: a tensor of shape [N]'\n"
                                               ">>> assert abs(cos.item() - 1.0) < 1e-06, f'two gradients in the same direction have cosine 1: got {cos.item()}'\n",
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
