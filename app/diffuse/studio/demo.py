"""The bundled demo model framed honestly, in one place: what it is (a 3M-parameter model that
continues Austen-like prose, models/README.md) and the prompts that show it at its best. The
first-run dialog and the empty chat both show these.

The prompts were picked on the demo model with its own recipe (64 tokens, 64 steps, blocks of 16,
temperature 0.7) over seeds 1-4: openings of a line of dialogue, which the model finishes as a
short quoted reply ("I shall not be in it."), read best. Open narration ("Continue: She had
never been so happy as") runs into 64 tokens of "and the room, and the rest of her sister", and
questions ("What is the capital of France?") get a few words of noise (before its continued training
of 2026-12-03, often nothing at all): it was trained on Austen and Unix fortunes only, with
"Continue:", "Repeat after me:" and "Tell me something." as its only instructions.
"""

SUGGESTED_PROMPTS = (
    'Continue: "My dear Emma,',
    "Continue: My dear Miss Bennet,",
    'Continue: "I do not know," said Marianne,',
)

DEMO_ABOUT = ("The demo model is tiny (3.3 million parameters, trained for 106 minutes on Jane "
              "Austen's novels and Unix fortunes): it continues Austen-like prose in short phrases "
              "and cannot answer questions. Start a prompt with “Continue:”. For real answers, "
              "get a real model.")
