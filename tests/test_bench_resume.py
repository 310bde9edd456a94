"""bench-resume: the follow-up's first token three ways, and what each computed."""
from engine.__main__ import main


def test_the_table_shows_that_a_hit_and_a_restore_compute_only_the_new_turn(capsys):
    assert main(["bench-resume", "--synthetic", "tiny-llama", "--backend", "numpy", "--context", "1024",
                 "--history", "300,2000", "--kv-pages", "16", "--kv-pages-all", "--memory-gib", "0.25",
                 "--prefill-chunk", "64"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if line.startswith("history\t")))
    row, skipped = out[head + 1].split("\t"), out[head + 2]
    assert row[0] == "300" and all(float(x) > 0 for x in row[1:4])
    cold, hit, disk = map(int, row[-1].split("/"))
    assert hit == disk == cold - 299 and cold > 300  # the history's last token is fed with the new turn
    assert skipped.startswith("2000\tskipped")
