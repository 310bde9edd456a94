"""State checkpoints: a failed batched step puts each row's recurrent state back from a saved slot
that may be several steps old, by replaying the decode steps since; the saved slots are refreshed
only when a stream is that many steps past them."""
import pytest
from test_scheduler import failing_stream, prompts, runner

from engine.engine import run_to_end
from engine.events import Failed
from engine.settings import SamplingParams
from engine.state_checkpoints import StateCheckpoints

LONG = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)


@pytest.mark.parametrize("fail_at", [12, 15])
def test_a_failed_step_replays_from_a_stale_checkpoint_and_the_others_equal_solo(fail_at):
    """With saves every 4 steps the failed step comes 1-3 steps after a save: the three rows of the
    step replay those steps from it, and the two good streams still equal their solo runs."""
    r, s = runner(model="synthetic:tiny-qwen3.5", parallel=3)
    solo = {i: run_to_end(r.scheduler(s), [r.sequence(i, s, None, LONG, lambda e: None, p)])[i]
            for i, p in enumerate(prompts(3), 1)}
    sched = r.scheduler(s)
    sched.checkpoints = StateCheckpoints(sched.cache, sched.lanes, replay_steps=4)
    events = []
    seqs = [r.sequence(i, s, None, LONG, events.append, p) for i, p in enumerate(prompts(3), 1)]
    bad = seqs[1]
    steps = []
    sched.after_forward = failing_stream(bad, fail_at, steps)
    done = run_to_end(sched, seqs)
    assert [e.request_id for e in events if isinstance(e, Failed)] == [2]
    assert bad.generated == fail_at
    for i in (1, 3):
        assert done[i].text == solo[i].text and done[i].tokens == 30
    batched = sum(1 for n in steps if n > 1)
    assert 3 < sched.checkpoints.copies < 3 * batched  # refreshed every 4 steps, not every step
    assert 0 < sched.checkpoints.replayed <= 3 * 3 and sched.checkpoints.replayed % 3 == 0


def test_restore_without_a_saved_slot_is_refused():
    r, s = runner(model="synthetic:tiny-qwen3.5", parallel=2)
    sched = r.scheduler(s)
    seq = r.sequence(1, s, None, LONG, lambda e: None, prompts(1)[0])
    sched.add(seq)
    while not seq.prompt_done:
        sched.step()
    with pytest.raises(RuntimeError, match="no state checkpoint"):
        sched.checkpoints.restore(seq, seq.computed, lambda rows: None)


def test_a_stateless_model_keeps_nothing():
    r, s = runner(parallel=2)
    sched = r.scheduler(s)
    run_to_end(sched, [r.sequence(i, s, None, LONG, lambda e: None, p) for i, p in enumerate(prompts(2), 1)])
    assert sched.checkpoints.copies == 0
