"""Run-ahead decode (Scheduler.run_ahead): the step after a steady decode step is queued on the tokens
the device chose before the host reads them. On the CPU the order of work is the same, so these tests
switch it on to check what it must keep: every token, event and finish as without it."""
from engine.engine import Runner, run_to_end
from engine.events import Finished, Token
from engine.ops.numpy_backend import NumpyBackend
from engine.scheduler import Scheduler
from engine.settings import EngineSettings, SamplingParams


def runner(**kw) -> tuple[Runner, EngineSettings]:
    s = EngineSettings(**{**dict(model="synthetic:tiny-llama", backend="numpy", parallel=4, context=256,
                                 paging="all", page_tokens=16, prefill_chunk=16, memory_gib=1), **kw})
    return Runner(s, log=lambda m: None), s


def prompts(n):
    return [[1] + [20 + (11 * i + j) % 200 for j in range(12 + 5 * i)] for i in range(n)]


def run(r: Runner, s: EngineSettings, params: list[SamplingParams], ahead: bool, backend=None):
    """Every stream's tokens, events and finish, with run-ahead on or off; the forwards fed on the
    device's tokens."""
    sched = Scheduler(s, r.plan(s), r.model, backend or r.backend, r.tokenizer)
    sched.run_ahead = ahead
    fed = []
    sched.after_forward = lambda rows: fed.append(rows.fed is not None)
    events = {i: [] for i in range(1, len(params) + 1)}
    seqs = [r.sequence(i, s, None, p, events[i].append, q)
            for (i, p), q in zip(enumerate(params, 1), prompts(len(params)))]
    done = run_to_end(sched, seqs)
    return {i: (q.tokens, events[i], done[i]) for i, q in zip(events, seqs)}, sum(fed), sched


def _stop_after(r, s, n: int) -> str:
    """A stop string that a greedy reply of the first prompt meets after about n tokens."""
    free = run_to_end(r.scheduler(s), [r.sequence(1, s, None, SamplingParams(temperature=0, max_tokens=40,
                                                                                ignore_eos=True), lambda e: None,
                                                   prompts(1)[0])])[1]
    return free.text[n:n + 3]


def test_run_ahead_keeps_every_token_event_and_finish():
    r, s = runner()
    stop = _stop_after(r, s, 12)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),  # stops mid-run
              SamplingParams(temperature=0, max_tokens=17, ignore_eos=True),  # a length limit between steps
              SamplingParams(temperature=1.0, top_k=40, seed=7, max_tokens=25, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    plain, fed_plain, _ = run(r, s, params, ahead=False)
    ahead, fed, sched = run(r, s, params, ahead=True)
    assert fed_plain == 0 and fed > 20  # it did run ahead, most steps
    assert plain[1][2].reason == "stop"
    for i in plain:
        assert ahead[i][0] == plain[i][0]
        assert [(e.token_id, e.text, e.tokens) for e in ahead[i][1] if isinstance(e, Token)] == \
               [(e.token_id, e.text, e.tokens) for e in plain[i][1] if isinstance(e, Token)]
        a, p = ahead[i][2], plain[i][2]
        assert (a.reason, a.text, a.tokens) == (p.reason, p.text, p.tokens)
    assert not sched.busy


def test_cancel_while_a_step_is_queued_ahead_frees_the_lane_and_keeps_a_prefix():
    r, s = runner()
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    plain, _, _ = run(r, s, [long], ahead=False)
    sched = Scheduler(s, r.plan(s), r.model, r.backend, r.tokenizer)
    sched.run_ahead = True
    fed = []
    sched.after_forward = lambda rows: fed.append(rows.fed is not None)
    events = []
    seq = r.sequence(1, s, None, long, events.append, prompts(1)[0])
    sched.add(seq)
    for _ in range(12):
        sched.step()
    assert fed[-1]  # the last forward is a step queued ahead, its tokens not read
    sched.cancel(1)
    assert sched.lanes.pool.used == 0 and not sched.busy
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert seq.tokens == plain[1][0][:len(seq.tokens)] and seq.generated > 5


class TiedOnce(NumpyBackend):
    """The CPU backend with a device's one failure to choose: the first token read with no logits
    left comes back -1 for row 0 (too many ties), as a GPU's sampler can leave a row to the host."""

    def __init__(self, ties: int):
        super().__init__()
        self.ties, self.tied = ties, 0

    def take(self, chosen, logits):
        toks = list(chosen)
        if logits is None and self.tied < self.ties:
            self.tied += 1
            toks[0] = -1
        return toks


def test_a_row_the_device_could_not_choose_is_computed_again_from_its_own_logits():
    r, s = runner()
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=40, seed=3, max_tokens=20, ignore_eos=True)]
    plain, _, _ = run(r, s, params, ahead=False)
    tied = TiedOnce(ties=3)
    ahead, fed, _ = run(r, s, params, ahead=True, backend=tied)
    assert tied.tied == 3 and fed > 10
    for i in plain:
        assert ahead[i][0] == plain[i][0]
        assert ahead[i][2].tokens == plain[i][2].tokens
