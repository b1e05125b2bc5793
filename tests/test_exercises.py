"""An exercise's check refuses an answer that delegates to the package
or to the torch function the statement forbids, lets the check itself
call them, puts everything back afterwards, and tells a student in a few
lines what is wrong, what is not done yet, and which earlier exercise to
fix first.

The notebook is played by a namespace of its own: cells are strings
executed in it, as IPython executes a cell in the user's namespace."""

import pytest
import torch
import torch.nn.functional as F

import transformer_lite
from transformer_lite import MultiHeadAttention, masks
from transformer_lite.classroom import WrongAnswer, exercise, forbid, outcomes

SETUP = """
import torch
import torch.nn.functional as F
from transformer_lite import causal_mask, padding_mask, target_mask
from transformer_lite.classroom import exercise, expect_equal, forbid
from transformer_lite.classroom.exercises import _OUTCOMES
tokens = torch.tensor([[5, 3, 0], [4, 0, 0]])
"""


def notebook(*cells: str) -> dict:
    """Run ``cells`` one after another in a fresh notebook namespace."""
    namespace = {"__name__": "__main__"}
    for number, cell in enumerate((SETUP, *cells)):
        exec(compile(cell, f"<cell {number}>", "exec"), namespace)
    return namespace


OWN = """
def make_padding_mask(tokens, pad_id):
    return (tokens != pad_id).unsqueeze(1)
"""
DELEGATES = """
def make_padding_mask(tokens, pad_id):
    return padding_mask(tokens, pad_id)
"""
IMPORTS_IT_AGAIN = """
def make_padding_mask(tokens, pad_id):
    from transformer_lite.masks import padding_mask as theirs
    return theirs(tokens, pad_id)
"""
CATCHES = """
def make_padding_mask(tokens, pad_id):
    try:
        return padding_mask(tokens, pad_id)
    except AssertionError:
        return (tokens != pad_id).unsqueeze(1)
"""
CHECK = """
with exercise("2.1", twins=[padding_mask]):
    expect_equal("make_padding_mask(tokens, 0)",
                 make_padding_mask(tokens, 0), padding_mask(tokens, 0))
"""


def test_an_answer_of_its_own_passes_and_says_so(capsys):
    notebook(OWN, CHECK)
    assert capsys.readouterr().out == "Exercise 2.1: every check passed.\n"
    assert outcomes()["2.1"] is True


@pytest.mark.parametrize("answer", [DELEGATES, IMPORTS_IT_AGAIN, CATCHES])
def test_an_answer_that_delegates_to_the_package_is_refused(answer):
    refused = "asks you to write this yourself"
    with pytest.raises(WrongAnswer, match=refused) as e:
        notebook(answer, CHECK)
    assert "transformer_lite.masks.padding_mask" in str(e.value)
    assert e.value.exercise == "2.1"
    assert outcomes()["2.1"] is False


def test_everything_is_put_back_after_the_block_even_when_it_failed():
    with pytest.raises(WrongAnswer):
        notebook(DELEGATES, CHECK)
    original = masks.padding_mask
    assert transformer_lite.padding_mask is original
    assert masks.target_mask.__globals__["padding_mask"] is original
    namespace = notebook(DELEGATES)
    assert namespace["padding_mask"] is original
    # and outside a block, delegating is allowed again
    assert torch.equal(namespace["make_padding_mask"](namespace["tokens"], 0),
                       original(namespace["tokens"], 0))  # fmt: skip


def test_the_check_may_call_the_twin_and_what_calls_it_inside():
    """target_mask calls padding_mask inside the package: called by the
    check, both serve; the check's comprehensions are the check's too."""
    notebook(
        OWN,
        """
with exercise("2.3", twins=[padding_mask, causal_mask], quiet=True):
    want = [target_mask(tokens[i:i + 1], 0) for i in range(2)]
    expect_equal("rows", [w.shape for w in want], [(1, 3, 3)] * 2)
""",
    )


def test_a_method_twin_is_refused_to_the_student_and_served_to_the_check():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.0).eval()
    x = torch.randn(1, 3, 8)
    namespace = notebook()
    namespace.update(mha=mha, x=x, MultiHeadAttention=MultiHeadAttention)
    exec(compile("""
def heads(x):
    return mha(x, x, x)  # the whole module, where its parts are asked
""", "<cell a>", "exec"), namespace)  # fmt: skip
    check = """
with exercise("3.3", twins=[MultiHeadAttention.forward], quiet=True):
    want = mha(x, x, x)
    got = heads(x)
"""
    forward = MultiHeadAttention.forward
    with pytest.raises(WrongAnswer, match="MultiHeadAttention.forward"):
        exec(compile(check, "<cell b>", "exec"), namespace)
    assert MultiHeadAttention.forward is forward  # put back
    assert torch.equal(mha(x, x, x), namespace["want"])  # the check's call


@pytest.mark.parametrize(
    "body",
    [
        "return torch.softmax(s, -1)",
        "return s.softmax(-1)",
        "return F.softmax(s, dim=-1)",
    ],  # fmt: skip
)
def test_a_forbidden_torch_function_is_refused_in_every_spelling(body):
    answer = f"def stable_softmax(s):\n    {body}\n"
    check = """
s = torch.randn(2, 5)
with exercise("1.2", twins=[torch.softmax, torch.Tensor.softmax, F.softmax]):
    expect_equal("n", stable_softmax(s).shape, torch.softmax(s, -1).shape)
"""
    with pytest.raises(WrongAnswer, match="write this yourself") as e:
        notebook(answer, check)
    assert "softmax" in str(e.value)
    written = (
        "def stable_softmax(s):\n    e = (s - s.amax(-1, True)).exp()\n"
        "    return e / e.sum(-1, keepdim=True)\n"
    )
    notebook(written, check)  # its own softmax passes


def test_a_stub_is_told_that_it_is_not_done_yet():
    stub = """
def make_padding_mask(tokens, pad_id):
    raise NotImplementedError()
"""
    with pytest.raises(WrongAnswer, match="2.1 is not done yet") as e:
        notebook(stub, CHECK)
    assert "NotImplementedError" in str(e.value)


def test_a_wrong_answer_names_the_earlier_exercise_it_builds_on():
    wrong_causal = """
def make_causal_mask(L):
    return torch.ones(1, L, L, dtype=torch.bool)  # not causal
with exercise("2.2", quiet=True):
    pass
_OUTCOMES["2.2"] = False  # as if its check had failed
def make_target_mask(tgt, pad_id):
    return (tgt != pad_id).unsqueeze(1) & make_causal_mask(tgt.size(1))
"""
    check = """
with exercise("2.3", twins=[target_mask], after=["2.2"]):
    expect_equal("make_target_mask(tokens, 0)",
                 make_target_mask(tokens, 0), target_mask(tokens, 0))
"""
    with pytest.raises(WrongAnswer, match="fix exercise 2.2 first") as e:
        notebook(wrong_causal, check)
    assert "differs" in str(e.value)  # and what is wrong, below


def test_a_correct_answer_keeps_its_point_when_an_earlier_one_failed(capsys):
    notebook(OWN, '_OUTCOMES["2.0"] = False',
             CHECK.replace('"2.1", ', '"2.1", after=["2.0"], '))  # fmt: skip
    assert "every check passed" in capsys.readouterr().out


def test_the_students_own_error_is_shown_as_it_is():
    broken = """
def make_padding_mask(tokens, pad_id):
    return tokens.unsqueeze(1) != pad_idd
"""
    with pytest.raises(NameError, match="pad_idd"):
        notebook(broken, CHECK)


def test_a_wrong_answer_renders_in_a_few_lines():
    error = WrongAnswer("mask differs in 2 places.\nHint: use &",
                        exercise="2.3")  # fmt: skip
    assert error._render_traceback_() == [
        "WrongAnswer (exercise 2.3):", "mask differs in 2 places.",
        "Hint: use &",
    ]  # fmt: skip
    assert WrongAnswer("x")._render_traceback_() == ["WrongAnswer:", "x"]


def test_forbid_refuses_what_it_cannot_guard():
    with pytest.raises(TypeError, match="a function or a torch callable"):
        forbid("1.1", [MultiHeadAttention])
    with pytest.raises(TypeError, match="a function or a torch callable"):
        exercise("1.1", twins=["padding_mask"])


def test_forbid_alone_refuses_without_printing(capsys):
    namespace = notebook(DELEGATES)
    with pytest.raises(WrongAnswer):
        exec(compile("""
with forbid("2.1", [padding_mask]):
    make_padding_mask(tokens, 0)
""", "<cell f>", "exec"), namespace)  # fmt: skip
    assert capsys.readouterr().out == ""
    assert F.softmax is torch.nn.functional.softmax


def test_a_name_the_check_cannot_find_says_to_run_the_cells_above():
    with pytest.raises(WrongAnswer, match="Run the cells above") as e:
        notebook(CHECK)  # make_padding_mask was never defined
    assert "NameError" in str(e.value)


def test_a_prediction_is_recorded_not_praised(capsys):
    notebook(
        'prediction = "uniform"',
        """
with exercise("2.8", prediction=True):
    expect_equal("prediction", prediction, "uniform")
""",
    )
    assert "prediction recorded" in capsys.readouterr().out


def test_watch_sees_the_largest_tensor_and_a_hidden_nan():
    from transformer_lite.classroom import watch

    scores = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    empty = torch.tensor([[True, True], [False, False]])
    with watch() as seen:
        hidden = scores.masked_fill(~empty, float("-inf")).softmax(-1)
        hidden = hidden.nan_to_num(0.0)  # the NaN row, hidden afterwards
    assert seen.made_nan and not hidden.isnan().any()
    assert seen.largest == 4 and (2, 2) in seen.shapes
    with watch() as seen:
        lowest = torch.finfo(scores.dtype).min
        scores.masked_fill(~empty, lowest).softmax(-1)
    assert not seen.made_nan


def test_a_torch_function_torch_never_dispatches_is_refused_by_name():
    """nn.utils.clip_grad_norm_ is Python that torch's function modes
    never see: it is refused where a module holds it by name."""
    answer = """
def clip(parameters, max_norm):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
"""
    check = """
w = torch.nn.Parameter(torch.ones(3))
w.grad = torch.full((3,), 4.0)
with exercise("6.5", twins=[torch.nn.utils.clip_grad_norm_]):
    clip([w], 1.0)
"""
    original = torch.nn.utils.clip_grad_norm_
    with pytest.raises(WrongAnswer, match="clip_grad_norm_"):
        notebook(answer, check)
    assert torch.nn.utils.clip_grad_norm_ is original  # put back
