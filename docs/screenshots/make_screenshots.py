"""Regenerate the README screenshots from the running app.

    python docs/screenshots/make_screenshots.py            # offscreen
    Xvfb :99 & DISPLAY=:99 QT_QPA_PLATFORM=xcb python docs/screenshots/make_screenshots.py

1. main-window.png: a replayed run mid-way (canvas, entropy heatmap, chat). No real LLaDA or Dream
   weights exist offline, so this run is the test suite's synthetic event stream spelling a
   written answer; everything on screen is drawn by the app as it would draw a live run.
2. cache-view.png: the cache view of the same run.
3. compare.png: compare mode, inter-step cache on vs off, run live by the real engine on the
   tiny random LLaDA the tests build (its tokens are noise; the steps, timings and cache are real).
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT / "tests" / "studio"), str(ROOT / "tests")]
platform = os.environ.get("QT_QPA_PLATFORM", "offscreen")
from conftest import EOS_ID, MASK_ID, synthetic_run  # noqa: E402  (sets offscreen)

os.environ["QT_QPA_PLATFORM"] = platform
os.environ["DIFFUSE_STUDIO_HOME"] = tempfile.mkdtemp(prefix="studio-shots-")

from PySide6.QtCore import QEventLoop  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

QUESTION = "Why is the sky blue?"
ANSWER = ("Sunlight is a mix of every colour. Air molecules scatter short wavelengths, like "
          "blue, far more than long ones, like red. So blue light reaches your eyes from every "
          "direction, and the whole sky glows blue.")


def settle(app, seconds=0.3):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def save(widget, name, scale=0.8):
    image = widget.grab().toImage()
    image = image.scaledToWidth(int(image.width() * scale))
    image.save(str(OUT / name))
    print(OUT / name, image.width(), image.height())


def demo_recording():
    from diffuse.recording import Recording
    words = re.findall(r" ?[A-Za-z]+|[.,]", ANSWER)
    vocab = ["<|mdm_mask|>", "<|endoftext|>"] + sorted(set(words))
    ids = [vocab.index(w) for w in words]
    events, result = synthetic_run(QUESTION, gen_length=64, steps=32, block_length=16, seed=3,
                                   answer=ids, vocab=vocab, step_ms=180.0)
    options = {"scheduler": "low_confidence", "gen_length": 64, "steps": 32,
               "block_length": 16, "cache": True}
    rec = Recording(prompt=QUESTION, options=options, events=events, result=result,
                    model={"name": "synthetic demo", "arch": "llada", "eos_ids": [EOS_ID],
                           "special_ids": [MASK_ID, EOS_ID]})
    return rec.finish(result, lambda ids: "".join(vocab[i] for i in ids))


def main():
    from diffuse.studio import theme
    from diffuse.studio.chat import answer_meta
    from diffuse.studio.conversations import Message
    from diffuse.studio.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    theme.apply(app)
    window = MainWindow()
    window.resize(1500, 900)
    window.show()
    window.side_tabs.setCurrentIndex(1)
    rec = demo_recording()
    path = Path(os.environ["DIFFUSE_STUDIO_HOME"]) / "demo.npz"
    rec.save(path)
    window.open_recording(path)
    run = window.run
    chat = window.chat
    chat.conversation.messages = [Message("user", QUESTION),
                                  Message("assistant", rec.result.text,
                                          answer_meta(run, str(path)))]
    chat.render()
    window.show_step(13)
    settle(app, 0.6)
    save(window, "main-window.png")
    window.views.setCurrentIndex(1)
    window.show_step(run.n_steps - 1)
    settle(app, 0.6)
    save(window.views, "cache-view.png", 1.0)

    import diffuse
    from diffuse.convert import convert_hf
    from fixtures.tiny_models import write_llada
    folder = Path(tempfile.mkdtemp(prefix="studio-shots-model-"))
    model_path = convert_hf(write_llada(folder / "LLaDA-tiny-Instruct"),
                            folder / "llada-tiny-f32.gguf", "f32")
    window.set_model(diffuse.load(model_path, threads=1))
    window.settings_panel.set_options({"gen_length": 64, "steps": 32, "block_length": 16,
                                       "threads": 1})
    window.open_compare()
    cmp = window.compare_window
    cmp.resize(1400, 760)
    cmp.prompt.setText(QUESTION)
    cmp.start()
    end = time.monotonic() + 120
    while time.monotonic() < end and not cmp.summary.text().startswith("A:"):
        settle(app, 0.1)
    settle(app, 0.5)
    save(cmp, "compare.png")
    cmp.close()
    window.close()


if __name__ == "__main__":
    main()
