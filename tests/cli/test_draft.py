import pytest

from cli.main import main


def test_draft_help_lists_train_and_eval(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["draft", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "eval" in out


def test_draft_train_help_shows_the_cache_default(capsys):
    with pytest.raises(SystemExit):
        main(["draft", "train", "--help"])
    assert ".cache/edgerun/eagle3/smollm2" in capsys.readouterr().out
