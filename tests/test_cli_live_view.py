"""`diffuse generate`'s live view in pseudo-terminals of several sizes: every frame fits, so none is
left behind in the scrollback, and stdout carries only the answer."""
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from diffuse import load

DIFFUSE = Path(sys.executable).parent / "diffuse"      # the console script
DEMO = Path(__file__).resolve().parent.parent / "models" / "diffuse-demo-3m.gguf"
PROMPT = "Continue: She was a woman of"
# One redraw: back to the start of the line, up over the last frame's other lines, clear below.
REDRAW = re.compile(r"\r(?:\x1b\[(\d+)A)?\x1b\[J")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def run_in_pty(cols: int, rows: int, *argv: str, interrupt_after: int = 0) -> tuple[int, str, str]:
    """Run `diffuse generate` with stderr on a terminal of cols x rows (stdout to a pipe): exit code,
    stdout and what the terminal received. interrupt_after: send Ctrl-C after that many bytes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR          # keep "\n" as the program wrote it
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen([str(DIFFUSE), "generate", "-m", str(DEMO), "-p", PROMPT,
                             "--threads", "1", *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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
    return proc.wait(timeout=60), out, received.decode()


def frames(screen: str) -> tuple[list[tuple[str, int]], str]:
    """(frame text, lines the next redraw moves up over) for every frame but the last; the rest."""
    pieces = REDRAW.split(screen)
    texts, ups = pieces[0::2], pieces[1::2]
    return [(text, int(up or 0)) for text, up in zip(texts, ups)], texts[-1]


@pytest.mark.parametrize("cols, rows", [(80, 24), (30, 10), (80, 6), (40, 6), (15, 3)])
def test_every_frame_fits_the_terminal(cols, rows):
    code, out, screen = run_in_pty(cols, rows, "--gen-length", "224", "--steps", "32", "--block-length", "56")
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
        assert "lines above" in screen                          # 224 positions do not fit in 5 lines
    assert "step " not in out and out.strip()                   # stdout: the answer only


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
