"""`diffuse generate`'s live view in pseudo-terminals of several sizes: every frame fits, so none is
left behind in the scrollback, and stdout carries only the answer."""
import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from diffuse import load
from diffuse.serve import Server

DIFFUSE = Path(sys.executable).parent / "diffuse"      # the console script
DEMO = Path(__file__).resolve().parent.parent / "models" / "diffuse-demo-3m.gguf"
PROMPT = "Continue: She was a woman of"
# One redraw: back to the start of the line and up over the last frame's other lines (each line
# then ends with "clear to the end of the line", the frame with "clear below").
REDRAW = re.compile(r"\r(?:\x1b\[(\d+)A)?")
SGR = re.compile(r"\x1b\[[0-9;]*[mKJ]")


def run_in_pty(cols: int, rows: int, *argv: str, interrupt_after: int = 0,
               model: tuple[str, ...] = ("-m", str(DEMO), "--threads", "1")) -> tuple[int, str, str]:
    """Run `diffuse generate` on `model` (a file, or --server URL) with stderr on a terminal of cols x
    rows (stdout to a pipe): exit code, stdout and what the terminal received. interrupt_after: send
    Ctrl-C after that many bytes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR          # keep "\n" as the program wrote it
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen([str(DIFFUSE), "generate", *model, "-p", PROMPT, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=slave, start_new_session=True)
    os.close(slave)
    received = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:                 # EIO: the child closed the terminal
            break
        if not data:
            break
        if interrupt_after and len(received) < interrupt_after <= len(received) + len(data):
            proc.send_signal(signal.SIGINT)
        received += data
    os.close(master)
    with proc.stdout:
        out = proc.stdout.read().decode()
    # A frame cut by the Ctrl-C may end inside a character on the terminal (seen: the tty dropping the
    # rest of a write in flight): the screen is read leniently, the answer on stdout strictly.
    return proc.wait(timeout=60), out, received.decode(errors="replace")


def frames(screen: str) -> tuple[list[tuple[str, int]], str]:
    """(frame text, lines the next redraw moves up over) for every frame but the last; the rest."""
    pieces = REDRAW.split(screen)
    texts, ups = pieces[0::2], pieces[1::2]
    return [(text, int(up or 0)) for text, up in zip(texts, ups)], texts[-1]


@pytest.mark.parametrize("cols, rows", [(80, 24), (30, 10), (80, 6), (40, 6), (15, 3)])
def test_every_frame_fits_the_terminal(cols, rows):
    # A fixed seed: the 3M demo model's answer is empty for a few seeds, and this one has text.
    code, out, screen = run_in_pty(cols, rows, "--gen-length", "224", "--steps", "32", "--block-length", "56",
                                   "--seed", "2")
    assert code == 0, screen
    drawn, last = frames(screen)
    steps = int(re.search(r"steps (\d+)/32", last.splitlines()[-1]).group(1))
    assert len(drawn) == steps - 1                              # one redraw per step after the first
    for text, up in drawn + [(last.rsplit("\n", 2)[0], None)]:  # the last frame, less the summary line
        lines = SGR.sub("", text).split("\n")
        assert len(lines) <= rows                               # taller would scroll a copy away
        assert all(len(line) < cols for line in lines)          # wider would wrap
        if up is not None:
            assert up == len(lines) - 1                         # back up exactly over this frame
    if cols < 20 or rows < 4:
        assert all(up == 0 for _, up in drawn)                  # the compact one-line view
    if (cols, rows) == (40, 6):
        assert re.search(r"\d+ lines? above", screen)             # 224 positions do not fit in 5 lines
    assert "step " not in out and out.strip()                   # stdout: the answer only
    assert "endoftext" not in screen                            # end-of-text padding is one dim dot each


def test_compact_view_on_a_tiny_terminal():
    code, out, screen = run_in_pty(15, 3, "--gen-length", "32", "--steps", "8", "--block-length", "32")
    assert code == 0
    drawn, _ = frames(screen)
    assert SGR.sub("", drawn[0][0]).startswith("step 1/8")
    code, out, screen = run_in_pty(60, 3, "--gen-length", "32", "--steps", "8", "--block-length", "32")
    assert re.search(r"step \d+/8 \u2595[\u2588\u2591]{8}\u258f \d+/32 decided", screen)


def test_ctrl_c_cancels_and_counts_only_decided_tokens():
    code, out, screen = run_in_pty(80, 24, "--gen-length", "224", "--steps", "224", "--block-length", "224",
                                   "--json", interrupt_after=2000)
    assert code == 130
    result = json.loads(out)
    assert result["stop_reason"] == "cancelled" and result["steps"] < 224
    model = load(str(DEMO))
    tokens = result["tokens"]
    ends = [i for i, t in enumerate(tokens) if t in model.tokenizer.eos_token_ids] + [len(tokens)]
    assert model.mask_token_id in tokens
    assert result["useful_length"] == sum(t != model.mask_token_id for t in tokens[:ends[0]])
    assert "(cancelled)" in screen
    # the answer marks each undecided position; the mask token's own text is never shown
    undecided = [i for i in result["undecided"] if i < ends[0]]
    assert undecided and result["text"].count("\u2591") == len(undecided)
    assert "mdm_mask" not in result["text"] and all(result["decided_step"][i] == -1 for i in undecided)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_small_tmux_pane_keeps_one_frame(tmp_path):
    """tmux copies a screen cleared from its top-left corner into the scrollback: a frame as tall
    as the pane, redrawn that way, left one copy per step there. One status line must remain."""
    socket, done = str(tmp_path / "tmux.sock"), tmp_path / "done"
    command = (f"{DIFFUSE} generate -m {DEMO} -p 'Once upon a time' --threads 1 --gen-length 224 "
               f"--block-length 32 --steps 64 --temperature 0.8 --seed 3 > {tmp_path / 'out.txt'}; touch {done}")
    tmux = ["tmux", "-S", socket, "-f", os.devnull]
    subprocess.run([*tmux, "new-session", "-d", "-x", "60", "-y", "12", "sh", "-c", f"{command}; sleep 600"],
                   check=True)
    try:
        for _ in range(1200):     # at most 120 s under load
            if done.exists():
                break
            time.sleep(0.1)
        assert done.exists()
        history = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-"], capture_output=True, text=True,
                                 check=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert "steps " in history                                  # the summary: the run finished
    assert len(re.findall(r"step \d+/\d+  block", history)) == 1, history


@pytest.fixture(scope="module")
def server():
    s = Server(load(DEMO, threads=1), port=0, api_key="live-view-key", max_batch=2)
    s.start()
    yield s
    s.stop()


def test_the_live_view_draws_the_steps_of_diffuse_serve(server):
    """--server: the same frames from the server's step events as from a local run's."""
    remote = ("--server", server.url, "--api-key", "live-view-key")
    options = ("--gen-length", "64", "--steps", "16", "--block-length", "32", "--seed", "4")
    code, out, screen = run_in_pty(50, 12, *options, model=remote)
    assert code == 0, screen
    drawn, last = frames(screen)
    steps = int(re.search(r"steps (\d+)/16", last.splitlines()[-1]).group(1))
    assert len(drawn) == steps - 1 and "(diffuse serve, http://127.0.0.1:" in last
    for text, up in drawn:
        lines = SGR.sub("", text).split("\n")
        assert len(lines) <= 12 and all(len(line) < 50 for line in lines) and up == len(lines) - 1
    assert re.search(r"step \d+/16 +block [12]/2", screen)      # one space apart where two do not fit
    local = run_in_pty(50, 12, *options)
    assert out == local[1]                      # the same answer as the model file gives


def test_ctrl_c_cancels_a_served_run(server):
    code, out, screen = run_in_pty(80, 24, "--gen-length", "224", "--steps", "224", "--block-length", "224", "--json",
                                   interrupt_after=2000, model=("--server", server.url, "--api-key", "live-view-key"))
    assert code == 130, screen
    result = json.loads(out)
    assert result["stop_reason"] == "cancelled" and 0 < result["steps"] < 224 and result["undecided"]
    assert "(cancelled)" in screen


@pytest.mark.parametrize("cols, rows", [(60, 24), (60, 5), (30, 12), (200, 8)])
def test_the_status_line_keeps_every_figure(cols, rows):
    """A new user's 60-column terminal cut the status line's last figure (the step's ms): the
    fields now close up, then wrap between fields, and every one shows whole."""
    import io
    from types import SimpleNamespace

    import numpy as np

    from diffuse.cli.generate import LiveView

    n, prompt = 2000, 8
    mask = np.zeros(prompt + n, bool)
    mask[prompt + 40:] = True
    ev = SimpleNamespace(step=11, steps_allowed=64, block=1, n_blocks=4, unmasked=np.array([50, 51, 52]),
                         edited=np.array([60, 61]), gen_mask=mask[prompt:], active=np.arange(32),
                         tokens=np.full(prompt + n, 7), total_ms=1234.4, prompt_length=prompt, mask=mask)
    tokenizer = SimpleNamespace(eos_token_ids=[0], decode=lambda ids: "ab")
    out = io.StringIO()
    view = LiveView(tokenizer, out)
    view.size = lambda: os.terminal_size((cols, rows))
    view(ev)
    lines = SGR.sub("", out.getvalue()).split("\n")
    assert len(lines) <= rows and all(len(line) < cols for line in lines)
    status = " ".join(line for line in lines if not set(line) <= {"a", "b", "\u2591"})
    for figure in ("step 12/64", "block 2/4", "+3", "edited 2", f"masked {n - 40}", f"active 32/{prompt + n}",
                   "1234 ms", "lines above"):
        assert figure in status, (figure, lines)
