"""A mock OpenAI endpoint in its own process for bench_judge.py (a real endpoint is remote).

Prints its base URL on the first line, then answers every chat request with one fixed judge
verdict after ``latency`` seconds, until killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes.mock_openai import MockOpenAI

ANSWER = json.dumps({"classification": "Completed", "reasoning": "the offer is in the cart",
                     "confidence": 0.9, "evidence": ["correct_offer_in_final_cart"]})

if __name__ == "__main__":
    mock = MockOpenAI(latency_s=float(sys.argv[1]) if len(sys.argv) > 1 else 0.2)
    mock.script(ANSWER, repeat=True)
    mock.start()
    print(mock.url, flush=True)
    while True:
        time.sleep(3600)
