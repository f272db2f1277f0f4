OK_FORMAT = True

test = {   'name': 'q1',
    'points': None,
    'suites': [   {   'cases': [   {   'code': '>>> att = torch.tensor([[1, 1, 1, 1, 1, 0]])\n'
                                               '>>> lm = torch.tensor([[0, 1, 0, 0, 1, 0]])\n'
                                               '>>> out = tool_output_mask(att, lm)\n'
                                               ">>> assert isinstance(out, torch.Tensor) and out.dtype == torch.bool, 'a torch.bool tensor'\n"
                                               ">>> assert out.shape == (1, 6), f'the mask has shape [B, T]: got {tuple(out.shape)}'\n"
                                               '>>> assert out.long().tolist() == [[0, 0, 1, 1, 0, 0]], f"only positions 2 and 3 are the interpreter\'s: got {out.long().tolist()}"\n',
                                       'hidden': False,
                                       'locked': False,
                                       'points': 0}],
                      'scored': True,
                      'setup': '',
                      'teardown': '',
                      'type': 'doctest'}]}
