"""The Python code the docs show, run as written: the README's CPU quick start comes from
python/examples/quickstart_numpy.py (scripts/doc-snippets.py keeps the README's block equal to
its marked region), so running the file runs the README's code."""

import os
import runpy

import pytest

import attnstate
import attnstate.testing

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def test_readme_quickstart_runs_and_agrees_with_one_pass(capsys):
    # The example asserts the merge against one-pass attention; a failure raises here.
    runpy.run_path(os.path.join(EXAMPLES, "quickstart_numpy.py"), run_name="__main__")
    assert "merge of the two halves == one pass" in capsys.readouterr().out


@pytest.mark.skipif(attnstate.testing._T is None, reason="built without the testing kit")
def test_testing_kit_to_inputs_example_runs(capsys, monkeypatch):
    # docs/testing_kit.md, "From Python": check_kernel with to_inputs; the example asserts that
    # float16 draws reach the kernel as float16 arrays, and check_kernel raises on a broken law.
    # It imports numpy_attention from its own folder, as `python python/examples/...` allows;
    # run_path does not put a file's folder on sys.path, and no other test may be relied on to.
    monkeypatch.syspath_prepend(EXAMPLES)
    runpy.run_path(os.path.join(EXAMPLES, "kit_to_inputs.py"), run_name="__main__")
    assert "exactness" in capsys.readouterr().out


def test_mla_example_runs_and_merges_into_one_pass(capsys):
    # docs/mla.md, "From Python": the DeepSeek-V3-shaped CPU example asserts that the states of
    # two shards of the keys merge into the one-pass state; a failure raises here.
    runpy.run_path(os.path.join(EXAMPLES, "mla_decode_numpy.py"), run_name="__main__")
    assert "merge of the two shards == one pass" in capsys.readouterr().out
