"""Scenario "cookbook_1": Recipe Box again, but its first sample data lacks the 'Banana Bread' recipe
that task 2 names, so only a sample-data repair by the acceptance gate makes task 2 solvable."""

from tests.fakes.synth_fixtures import recipes

NAME = "cookbook_1"
SCENARIO = {"name": NAME, "description": recipes.SCENARIO["description"], "category": "cookbook",
            "source_name": "Cookbook", "crud_suitable": True, "classifier_reason": "users manage their recipes"}
TASKS, TABLES, SPEC, ENV_CODE = recipes.TASKS, recipes.TABLES, recipes.SPEC, recipes.ENV_CODE
VERIFIERS, SOLUTIONS = recipes.VERIFIERS, recipes.SOLUTIONS

BANANA = "INSERT INTO recipes (id, owner_id, title, servings, minutes) VALUES (2, 1, 'Banana Bread', 8, 70);"
SAMPLE_MISSING = [
    recipes.SAMPLE[0],
    {**recipes.SAMPLE[1], "insert_statements": [s for s in recipes.SAMPLE[1]["insert_statements"] if s != BANANA]},
    recipes.SAMPLE[2],
]

# Data repair answers, in order: one that violates a foreign key (owner 99 does not exist); one
# that adds the recipe but also a second 'Tomato Soup' already at 6 servings, which makes the
# no-op look complete to task 1's accepted verifier; then the right one.
ROWS_BAD_FK = [{"table_name": "recipes", "reasoning": "Task 2 names it.", "insert_statements": [
    "INSERT INTO recipes (id, owner_id, title, servings, minutes) VALUES (2, 99, 'Banana Bread', 8, 70);"]}]
ROWS_BREAK_TASK_1 = [{"table_name": "recipes", "reasoning": "Task 2 names it; another soup for variety.",
                      "insert_statements": [
                          "INSERT INTO recipes (id, owner_id, title, servings, minutes) VALUES (0, 1, 'Tomato Soup', 6, 15);",
                          BANANA]}]
ROWS_GOOD = [{"table_name": "recipes", "reasoning": "Task 2 names it.", "insert_statements": [BANANA]}]
