"""The stack id is a content hash: what the agent ships and Echo joins on must agree for equal stacks and
differ for different ones (a kernel stack-map id would not)."""

from rankecho.shared.stacks import join_frames, split_frames, stack_id


def test_equal_frames_give_equal_ids_and_any_change_another() -> None:
    frames = ["cudaMalloc", "allocate_cache", "train.py:forward:88"]
    assert stack_id(frames) == stack_id(list(frames))
    assert len(stack_id(frames)) == 16 and int(stack_id(frames), 16) >= 0
    moved_line = ["cudaMalloc", "allocate_cache", "train.py:forward:89"]
    others = [frames[::-1], frames[:2], [*frames, "main"], moved_line]
    assert len({stack_id(f) for f in [frames, *others]}) == 5


def test_frames_survive_the_wire_value() -> None:
    frames = ["__clock_nanosleep", "[unknown]", "pyrank.py:fetch_batch:41"]
    assert split_frames(join_frames(frames)) == frames
    assert split_frames("") == []
