"""benchmarks.cpu_step: how it sums a profile's operations by kind."""

from benchmarks import cpu_step


def _thread(tid: int, name: str) -> dict:
    return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}


def _op(tid: int, name: str, start: float, duration: float) -> dict:
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": start, "dur": duration}


def test_kinds_follow_xla_s_thunk_names():
    assert cpu_step.kind_of("ynn_fusion.12") == "products in a library"
    assert cpu_step.kind_of("xnn_fusion") == "products in a library"
    assert cpu_step.kind_of("dot_general.3") == "products in Eigen"
    assert cpu_step.kind_of("while.826") == "loops"
    assert cpu_step.kind_of("copy_bitcast_fusion.4") == "copies and transposes"
    assert cpu_step.kind_of("transpose_copy_fusion") == "copies and transposes"
    assert cpu_step.kind_of("multiply_erf_fusion.5") == "other fusions and operations"


def test_an_operation_s_own_time_leaves_out_what_runs_inside_it():
    events = [
        _thread(1, "tf_XLAEigen/123"),
        _thread(2, "tf_XLAPjRtCpuClient/456"),
        _thread(3, "python"),
        # A loop of 100 us holding two products (30 + 20 us) and bookkeeping events.
        _op(1, "while.1", 0, 100),
        _op(1, "ThunkExecutor::Execute", 0, 100),
        _op(1, "ynn_fusion.7", 10, 30),
        _op(1, "end: ynn_fusion.7", 40, 0),
        _op(1, "ynn_fusion.6", 50, 20),
        _op(1, "SlinkyThreadPool::Await", 55, 5),
        # After the loop, on the same thread, and at once on another runtime thread.
        _op(1, "subtract_exponential_fusion.1", 100, 7),
        _op(2, "dot_general.99", 90, 15),
        _op(2, "ThreadpoolListener::StartRegion", 95, 1),
        # Python's thread is not XLA's runtime: not counted.
        _op(3, "PjitFunction(accumulate)", 0, 500),
    ]
    totals = cpu_step.own_times(events)
    assert totals == {
        "products in a library": 50,
        "products in Eigen": 15,
        "loops": 50,
        "copies and transposes": 0,
        "other fusions and operations": 7,
    }
