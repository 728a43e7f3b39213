"""The bounds a policy text keeps before the Cedar engine reads it (countersign/core/policy_bounds.py):
brackets of every kind and `if`s count, what is in a string literal or a comment does not, and the
refusal names the bound and where it is passed."""

from __future__ import annotations

from countersign.core.policy_bounds import MAX_NESTING, MAX_POLICY_CHARS, bounds_refusal

PERMIT = '@id("p") permit(principal, action, resource) when {{ {} }};'


def nested(open_: str, close: str, depth: int, inner: str = "true") -> str:
    return PERMIT.format(open_ * depth + inner + close * depth)


def test_readable_policies_keep_the_bounds() -> None:
    text = (
        '@id("no-competitor") @approvals("2") @approvers("reviewer,admin")\n'
        'permit(principal, action == Countersign::Action::"send_email", resource)\n'
        'when { (context.args.to like "*@x.example" || [1, 2].contains(1)) && {a: 1}.a == 1 }\n'
        'unless { if context.risk == "high" then true else false };\n'
    ) * 200
    assert bounds_refusal(text) is None


def test_each_bracket_kind_counts_and_the_refusal_names_the_bound_and_where() -> None:
    braces = MAX_NESTING - 1  # the `when { … }` is one level
    for open_, close in ("()", "[]", "{}"):
        assert bounds_refusal(nested(open_, close, braces)) is None
        refusal = bounds_refusal(nested(open_, close, braces + 1))
        assert refusal is not None
        assert f"nests deeper than {MAX_NESTING} levels" in refusal and "line 1, column" in refusal


def test_open_ifs_count_as_levels() -> None:
    chain = "if true then " * MAX_NESTING + "true" + " else false" * MAX_NESTING
    refusal = bounds_refusal(PERMIT.format(chain))
    assert refusal is not None and "brackets and `if`s" in refusal
    # separate policies' `if`s do not add up, nor does a word that merely contains "if"
    one = PERMIT.format("if true then context.diff else false")
    assert bounds_refusal(one * (MAX_NESTING * 2)) is None


def test_strings_and_comments_count_for_nothing() -> None:
    deep = "(" * 3_000
    quoted = PERMIT.format(f'context.args.to == "{deep} \\" {deep}"')
    commented = f"// {deep}\n" + PERMIT.format("true") + f" // if if if {deep}"
    assert bounds_refusal(quoted) is None and bounds_refusal(commented) is None


def test_a_policy_that_does_not_close_what_it_opened_keeps_counting() -> None:
    text = ('@id("p") permit(principal, action, resource) when { (((( ; ') * 10
    assert bounds_refusal(text) is not None


def test_size_is_bounded() -> None:
    refusal = bounds_refusal(" " * (MAX_POLICY_CHARS + 1))
    assert refusal == (
        f"the policy text is {MAX_POLICY_CHARS + 1} characters, over the limit of {MAX_POLICY_CHARS}"
    )
