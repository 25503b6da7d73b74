"""Input-grounded code-edit prompts: the answer copies most of the prompt (n-gram drafting's home ground)."""

from __future__ import annotations

_SNIPPETS = [
    (
        "Rename the variable `total` to `result` in this function. Reply with the full code only.",
        "def compute_total(items):\n    total = 0\n    for item in items:\n"
        "        total += item.price * item.quantity\n    return total\n",
    ),
    (
        "Add type hints to this function. Reply with the full code only.",
        "def merge_counts(first, second):\n    merged = dict(first)\n    for key, value in second.items():\n"
        "        merged[key] = merged.get(key, 0) + value\n    return merged\n",
    ),
    (
        "Add a docstring to this function. Reply with the full code only.",
        "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n"
        "        return high\n    return value\n",
    ),
    (
        "Rewrite this function to use an f-string. Reply with the full code only.",
        "def greet(name, age):\n    message = 'Hello, ' + name + '! You are ' + str(age) + ' years old.'\n"
        "    print(message)\n    return message\n",
    ),
    (
        "Rename the function `fetch_rows` to `load_rows`. Reply with the full code only.",
        "import sqlite3\n\n\ndef fetch_rows(path, table):\n    connection = sqlite3.connect(path)\n"
        "    cursor = connection.cursor()\n    cursor.execute(f'SELECT * FROM {table}')\n"
        "    rows = cursor.fetchall()\n    connection.close()\n    return rows\n",
    ),
    (
        "Fix the bug in this function (it should return the largest number). Reply with the full code only.",
        "def largest(numbers):\n    best = numbers[0]\n    for number in numbers:\n"
        "        if number < best:\n            best = number\n    return best\n",
    ),
    (
        "Add a `reset` method that sets `count` back to zero. Reply with the full code only.",
        "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n"
        "        self.count += 1\n        return self.count\n",
    ),
    (
        "Change the default port from 8080 to 9000. Reply with the full code only.",
        "import argparse\n\n\ndef parse_args():\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--host', default='localhost')\n"
        "    parser.add_argument('--port', type=int, default=8080)\n    return parser.parse_args()\n",
    ),
]


def code_edit_prompts(n: int | None = None) -> list[str]:
    """``n`` user messages (cycling through the snippets), each an instruction followed by its code."""
    messages = [f"{instruction}\n\n```python\n{code}```" for instruction, code in _SNIPPETS]
    count = len(messages) if n is None else n
    return [messages[i % len(messages)] for i in range(count)]
