"""The real target's shared fixtures: the target on the CPU (fp32), a smoke-trained head, the evaluation
prompts. Each test module skips first where the target extra or the GGUF is missing; the imports here wait
for a fixture to be used."""

import pytest


@pytest.fixture(scope="session")
def target():
    import torch

    from tfe.target import load_target

    torch.manual_seed(0)
    return load_target(dtype=torch.float32)


@pytest.fixture(scope="session")
def smoke(target, tmp_path_factory):
    """(checkpoint dir, .tfe head) from a smoke training run (a few minutes on a CPU), profiled: its log is
    train.log beside the checkpoint dir."""
    import tfe
    from tfe.train_head import Settings, train

    root = tmp_path_factory.mktemp("head")
    lines = []
    train(target, Settings.smoke(), root / "eagle3", log=lines.append, profile=True)
    (root / "train.log").write_text("\n".join(lines) + "\n")
    head = tfe.convert(root / "eagle3", root / "smoke.tfe")
    return root / "eagle3", head


@pytest.fixture(scope="session")
def chats(target):
    """The prose, code, tool-call and chat evaluation prompts, encoded."""
    from tfe import prompts

    return [target.encode_chat(p.text) for p in prompts.evaluation_prompts()[:4]]
