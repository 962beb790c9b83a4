"""One trajectory per format rule, each breaking exactly that rule, plus a clean one."""

from __future__ import annotations

import json

import pytest

from judge import FormatChecker, FormatRule, Outcome, check_format


def _check(trajectory):
    """``check_format``, and the incremental ``FormatChecker`` (the trainer's) agreeing with it
    after every message of the trajectory."""
    checker = FormatChecker(trajectory.tools)
    for i, msg in enumerate(trajectory.messages):
        checker.add(msg)
        prefix = trajectory.model_copy(update={"messages": trajectory.messages[:i + 1]})
        assert checker.report() == check_format(prefix), i
    report = check_format(trajectory)
    assert checker.report() == report
    return report


def test_clean_trajectory_passes(good_traj):
    report = _check(good_traj.build())
    assert report.ok and report.rule is None and report.to_verdict() is None


def test_rule1_missing_reasoning(traj):
    t = traj("task").list_tools()
    t.say('<tool_call>{"name": "call_tool", "arguments": {"tool_name": "search_products", '
          '"arguments": "{\\"query\\": \\"x\\"}"}}</tool_call>')
    t.tool({"ok": True, "result": []}).final()
    report = _check(t.build())
    assert report.rule is FormatRule.reasoning
    assert (report.step, report.turn) == (4, 1)
    verdict = report.to_verdict()
    assert verdict.outcome is Outcome.format_error and verdict.reward == -1.0


def test_rule1_empty_think_counts_as_missing(traj):
    t = traj("task").list_tools().say("<think>   </think>\nAll done.")
    assert _check(t.build()).rule is FormatRule.reasoning


def test_rule2_unknown_tool(traj):
    t = traj("task").list_tools().use("delete_everything", {}).final()
    report = _check(t.build())
    assert report.rule is FormatRule.known_tool and "delete_everything" in report.message
    assert report.step == 4


def test_rule3_arguments_not_json(traj):
    t = traj("task").list_tools()
    t.call("call_tool", {"tool_name": "search_products", "arguments": "{query: x"})
    t.tool({"ok": True, "result": []}).final()
    report = _check(t.build())
    assert report.rule is FormatRule.valid_arguments and "not valid JSON" in report.message


def test_rule3_arguments_fail_the_schema(traj):
    t = traj("task").list_tools().use("add_item_to_cart",
                                      {"product_offer_id": "one", "quantity": 1}).final()
    report = _check(t.build())
    assert report.rule is FormatRule.valid_arguments
    assert "product_offer_id" in report.message


def test_rule3_malformed_tool_call_block(traj):
    t = traj("task").list_tools().say("<think>go</think><tool_call>{not json</tool_call>")
    assert _check(t.build()).rule is FormatRule.valid_arguments


def test_rule4_list_tools_not_first(traj):
    t = traj("task").use("search_products", {"query": "x"}, [])
    t.list_tools().final()
    report = _check(t.build())
    assert report.rule is FormatRule.list_tools_first and report.turn == 0


def test_rule4_list_tools_twice(traj):
    t = traj("task").list_tools().use("search_products", {"query": "x"}, []).list_tools().final()
    report = _check(t.build())
    assert report.rule is FormatRule.list_tools_first and report.turn == 2


def test_rule4_never_listed(traj):
    assert _check(traj("task").final().build()).rule is FormatRule.list_tools_first


def test_rule5_no_successful_call(traj):
    t = (traj("task").list_tools().use("search_products", {"query": "x"}, ok=False)
         .use("search_products", {"query": "y"}, ok=False).final())
    report = _check(t.build())
    assert report.rule is FormatRule.successful_call
    assert report.step == len(t.messages) - 1


def test_rule5_list_tools_then_a_refusal_is_a_format_error(traj):
    # The paper penalizes refusals: two turns and no real call is not a pass.
    report = _check(traj("task").list_tools().final("I cannot help with that.").build())
    assert report.rule is FormatRule.successful_call and report.turn == 1
    verdict = report.to_verdict()
    assert (verdict.outcome, verdict.reward) == (Outcome.format_error, -1.0)


def test_rule5_one_successful_call_is_enough(traj):
    t = (traj("task").list_tools().use("search_products", {"query": "x"}, ok=False)
         .use("search_products", {"query": "y"}).final("Nothing matches."))
    assert _check(t.build()).ok


def test_rule2_an_empty_tool_list_names_no_tool(traj):
    t = traj("task")
    t.call("list_tools", {})
    t.tool({"ok": True, "result": []})
    t.use("search_products", {"query": "x"}).final()
    report = _check(t.build())
    assert report.rule is FormatRule.known_tool and report.turn == 1


@pytest.mark.parametrize("answer", ["tools: search_products, add_item_to_cart",
                                    {"ok": True, "result": {"count": 2}},
                                    {"ok": True, "result": "search_products"}])
def test_rule2_an_unreadable_tool_list_is_no_free_pass(traj, answer):
    t = traj("task")
    t.call("list_tools", {})
    t.tool(answer)
    t.use("made_up_tool", {"anything": 1}).final()
    report = _check(t.build())
    # no name can be checked: not a pass, and not the agent's fault -> invalid, never a reward
    assert report.rule is FormatRule.environment_error and report.turn == 1
    verdict = report.to_verdict()
    assert verdict.valid is False and verdict.reward is None


def test_rule2_unreadable_list_falls_back_to_the_trajectory_tools(traj, shop_tools):
    t = traj("task")
    t.call("list_tools", {})
    t.tool("tools: search_products, add_item_to_cart")
    t.use("made_up_tool", {}).final()
    report = _check(t.build().model_copy(update={"tools": shop_tools}))
    assert report.rule is FormatRule.known_tool


def test_rule6_server_error_is_an_environment_error(traj):
    t = (traj("task").list_tools()
         .use("search_products", {"query": "x"}, ok=False, kind="env_error").final())
    report = _check(t.build())
    assert report.rule is FormatRule.environment_error and report.step == 5
    verdict = report.to_verdict()
    assert verdict.outcome is Outcome.environment_error
    assert verdict.reward is None and verdict.valid is False


def test_first_violation_wins(traj):
    # the unknown tool comes before the missing reasoning: that is what is reported
    t = traj("task").list_tools().use("nope", {}).say("no reasoning here")
    assert _check(t.build()).rule is FormatRule.known_tool


def test_list_tools_schemas_fall_back_to_trajectory_tools(traj, shop_tools):
    t = traj("task")
    t.call("list_tools", {})
    t.tool({"ok": True, "result": ["search_products", "add_item_to_cart"]})  # names only
    t.use("add_item_to_cart", {"product_offer_id": 1}).final()  # quantity is missing
    assert _check(t.build()).ok  # no schema known: only names are checked
    with_schemas = t.build().model_copy(update={"tools": shop_tools})
    report = _check(with_schemas)
    assert report.rule is FormatRule.valid_arguments and "quantity" in report.message


def test_reasoning_content_and_open_think_count(traj):
    t = traj("task")
    body = json.dumps({"name": "list_tools", "arguments": {}})
    t.messages.append({"role": "assistant", "content": f"<tool_call>{body}</tool_call>",
                       "reasoning_content": "Let me look."})
    t.tool({"ok": True, "result": ["search_products"]})
    t.say('I looked around first.</think>\n<tool_call>{"name": "call_tool", "arguments": '
          '{"tool_name": "search_products", "arguments": "{\\"query\\": \\"x\\"}"}}</tool_call>')
    t.tool({"ok": True, "result": []})
    t.say("Found nothing.</think>\nNothing to do.")  # template-opened <think>
    assert _check(t.build()).ok
