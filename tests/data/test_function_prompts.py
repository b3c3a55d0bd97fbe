"""Code prompts at scale: functions with docstrings from installed packages, disjoint from HumanEval."""

from specdiff_lightning.data.function_prompts import function_prompts, humaneval_disjoint

PROBLEMS = [
    {
        "entry_point": "has_close_elements",
        "prompt": 'def has_close_elements(numbers, threshold):\n    """ Check if in given list of numbers, are any two '
        'numbers closer to each other than given threshold."""\n',
        "canonical_solution": "    return any(abs(a - b) < threshold for a in numbers for b in numbers)\n",
    }
]


def test_prompts_overlapping_humaneval_are_dropped_and_counted():
    prompts = [
        {"id": "a", "prompt": 'def has_close_elements(xs):\n    """Mine."""\n'},  # a HumanEval entry point
        {
            "id": "b",
            "prompt": 'def f(x):\n    """Check if in given list of numbers, are any two numbers close."""\n',
        },
        {"id": "c", "prompt": 'def parse(text):\n    """Split text on commas."""\n'},
    ]
    kept, report = humaneval_disjoint(prompts, PROBLEMS)
    assert [p["id"] for p in kept] == ["c"]
    assert report == {"kept": 1, "dropped_name": 1, "dropped_ngram": 1, "ngram": 8}


def test_package_functions_become_header_and_docstring_prompts():
    prompts = function_prompts(packages=("click",), stdlib=False, max_chars=600)
    assert len(prompts) > 20 and all(p["id"].startswith("click/") for p in prompts)
    assert all(len(p["prompt"]) <= 600 and ('"""' in p["prompt"] or "'''" in p["prompt"]) for p in prompts)
    assert len({p["prompt"] for p in prompts}) == len(prompts)  # vendored copies count once
    assert function_prompts(packages=("click",), stdlib=False, max_chars=600, limit=5) == prompts[:5]
