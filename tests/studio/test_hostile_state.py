"""Damaged local state: settings with bad values or no readable form, conversations with wrong
field types, garbage or hostile ids, a broken recording named on the command line. The Studio
starts anyway: bad values are dropped, unreadable files kept as NAME.bad, nothing else deleted,
and each problem is noted once (storage.take_problems) for the window to show.
"""
from __future__ import annotations

import json
import os

import pytest

from diffuse import DiffuseError
from diffuse.studio import storage
from diffuse.studio.conversations import Conversation, ConversationStore, Message
from diffuse.studio.main_window import MainWindow


@pytest.fixture
def noted(monkeypatch):
    """Every problem noted, whether or not the window has taken them already."""
    seen: list[str] = []
    real = storage.note_problem
    monkeypatch.setattr(storage, "note_problem", lambda m: (seen.append(m), real(m)))
    return seen


def start(qtbot) -> MainWindow:
    """The main window as the window fixtures build it, on the private app home."""
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    return w


def files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- settings values --------------------------------------------------------------------------

# (key, bad value as written in the INI file), by the option's kind.
BAD_VALUES = {
    "int": [("steps", "99999999999"), ("steps", "-5"), ("steps", "abc"), ("steps", "1.5"),
            ("gen_length", "0"), ("block_length", "1e400"), ("top_k", "a, b")],
    "float": [("temperature", "nan"), ("temperature", "inf"), ("temperature", "1e308"),
              ("top_p", "0"), ("eps", "1"), ("threshold", "-0.5"), ("cfg_scale", "x")],
    "bool": [("cache", "banana"), ("cache", "a, b"), ("chat", "2")],
    "choice": [("scheduler", "bogus"), ("scheduler", "a, b"), ("scheduler", "../x")],
    "seed": [("seed", "-1"), ("seed", str(2**70)), ("seed", str(2**40))],
    "threads": [("threads", "99999999999"), ("threads", "-3")],
}
FLAT_VALUES = [(kind, k, v) for kind, cases in BAD_VALUES.items() for k, v in cases]


def test_value_counts():
    print("bad settings values per kind:", {k: len(v) for k, v in BAD_VALUES.items()},
          "total", len(FLAT_VALUES))
    assert len(BAD_VALUES) == 6 and len(FLAT_VALUES) >= 20


@pytest.mark.parametrize("kind,key,raw", FLAT_VALUES, ids=[f"{k}: {n}={v}" for k, n, v in FLAT_VALUES])
def test_bad_setting_is_dropped_once(qtbot, studio_home, noted, kind, key, raw):
    ini = studio_home / "settings.ini"
    studio_home.mkdir(parents=True, exist_ok=True)
    ini.write_text(f"[generation]\n{key}={raw}\nkeep_active=3\n", encoding="utf-8")
    w = start(qtbot)
    opts = w.settings_panel.options()
    assert opts["keep_active"] == 3                  # the good values survive
    if kind not in ("bool",):
        assert opts[key] is None                     # auto: the model's default
    assert any(key in m for m in noted), noted
    assert ini.is_file() and not list(studio_home.glob("*.bad*"))
    assert f"{key}=" not in ini.read_text(encoding="utf-8")     # told once: not again next start
    w.close()
    noted.clear()
    start(qtbot).close()
    assert not noted


def test_window_settings_of_the_wrong_type_are_dropped(qtbot, studio_home, noted):
    studio_home.mkdir(parents=True, exist_ok=True)
    (studio_home / "settings.ini").write_text(
        "[window]\ngeometry=hello\nsplitter=a, b\n[models]\nlast=a, b\n", encoding="utf-8")
    w = start(qtbot)
    w.close()
    assert sum(k in m for m in noted for k in ("geometry", "splitter", "models/last")) == 3


# -- settings files -----------------------------------------------------------------------------

UNREADABLE_SETTINGS = {
    "binary garbage": os.urandom(3000),
    "NUL bytes": b"[generation]\nsteps=5\0\0\0\n",
    "not UTF-8": b"[generation]\nsteps=\xff\xfe5\n",
    "unclosed group": b"[generation\nsteps=5\n",
    "too large": b"[generation]\n" + b"; padding\n" * 200_000,
}


@pytest.mark.parametrize("name", UNREADABLE_SETTINGS)
def test_unreadable_settings_file_is_kept_as_bad(qtbot, studio_home, noted, name):
    studio_home.mkdir(parents=True, exist_ok=True)
    data = UNREADABLE_SETTINGS[name]
    (studio_home / "settings.ini").write_bytes(data)
    (studio_home / "settings.ini.bad").write_bytes(b"an older damaged file")
    w = start(qtbot)
    assert w.settings_panel.options()["steps"] is None
    w.close()
    assert (studio_home / "settings.ini.bad.2").read_bytes() == data
    assert (studio_home / "settings.ini.bad").read_bytes() == b"an older damaged file"
    assert len([m for m in noted if "settings.ini" in m]) == 1


def test_settings_file_that_is_a_folder_is_moved_aside(qtbot, studio_home, noted):
    (studio_home / "settings.ini").mkdir(parents=True)
    (studio_home / "settings.ini" / "keep.txt").write_text("mine")
    start(qtbot).close()
    assert (studio_home / "settings.ini.bad" / "keep.txt").read_text() == "mine"
    assert len(noted) == 1


# -- conversations ------------------------------------------------------------------------------

GOOD = {"id": "ignored", "title": "A good one", "created": 1.0,
        "messages": [{"role": "user", "text": "hi", "meta": {}}]}
BAD_CONVERSATIONS = {
    "wrong types": {
        "title a number": GOOD | {"title": 5},
        "messages an object": GOOD | {"messages": {}},
        "created a string": GOOD | {"created": "now"},
        "created NaN": GOOD | {"created": float("nan")},
        "created a bool": GOOD | {"created": True},
        "message a string": GOOD | {"messages": ["hi"]},
        "unknown role": GOOD | {"messages": [{"role": "system", "text": "x", "meta": {}}]},
        "text null": GOOD | {"messages": [{"role": "user", "text": None, "meta": {}}]},
        "meta a list": GOOD | {"messages": [{"role": "user", "text": "x", "meta": []}]},
        "recording a list": GOOD | {"messages": [
            {"role": "assistant", "text": "x", "meta": {"recording": [1]}}]},
        "total_ms text": GOOD | {"messages": [
            {"role": "assistant", "text": "x", "meta": {"total_ms": "slow"}}]},
        "model a number": GOOD | {"messages": [
            {"role": "assistant", "text": "x", "meta": {"model": 3}}]},
        "options a list": GOOD | {"messages": [
            {"role": "assistant", "text": "x", "meta": {"options": ["a"]}}]},
        "arch an object": GOOD | {"messages": [
            {"role": "assistant", "text": "x", "meta": {"arch": {"a": 1}}}]},
        "top level a list": [GOOD],
        "top level null": None,
    },
    "truncated": {
        "half": json.dumps(GOOD)[:30].encode(),
        "one byte short": json.dumps(GOOD)[:-1].encode(),
        "empty": b"",
    },
    "garbage": {
        "random bytes": os.urandom(2048),
        "UTF-16": json.dumps(GOOD).encode("utf-16"),
        "deeply nested": b"[" * 100_000,
        "NUL bytes": b"\0" * 64,
    },
    "hostile file names": {
        "a b": GOOD, "x.y": GOOD, "..": GOOD, "\u00e9t\u00e9": GOOD, "x" * 65: GOOD,
    },
}
HOSTILE_IDS = ["../../x", "../x", "/etc/passwd", "a/b", "", ".", "..", "x" * 65, "a\0b",
               "a b", "con.json", 5, None]


def test_conversation_counts():
    counts = {cls: len(c) for cls, c in BAD_CONVERSATIONS.items()} | {"hostile ids": len(HOSTILE_IDS)}
    print("hostile conversations per class:", counts, "total", sum(counts.values()))
    assert all(c >= 3 for c in counts.values())


def test_damaged_conversations_are_kept_as_bad(qtbot, studio_home, noted):
    folder = storage.conversations_dir()
    store = ConversationStore(folder)
    store.save(Conversation(id="good_one-1", title="Keep me", messages=[Message("user", "hello")]))
    (folder / "notes.txt").write_text("not a conversation, not ours")
    damaged = {}
    for cls, cases in BAD_CONVERSATIONS.items():
        for i, (name, value) in enumerate(cases.items()):
            stem = name if cls == "hostile file names" else f"{cls[:5]}{i}".replace(" ", "_")
            data = value if isinstance(value, bytes) else json.dumps(value).encode()
            (folder / f"{stem}.json").write_bytes(data)
            damaged[f"{stem}.json"] = data
    before = files(folder)
    w = start(qtbot)
    assert w.chat.conversation.title == "Keep me"
    assert [title for _, title in store.list()] == ["Keep me"]
    w.close()
    after = files(folder)
    for name, data in damaged.items():
        assert name not in after and after[f"{name}.bad"] == data, name
    assert {k: v for k, v in after.items() if not k.endswith(".bad")} == {
        k: v for k, v in before.items() if k not in damaged}        # nothing else touched
    assert len([m for m in noted if ".json" in m]) == len(damaged)


@pytest.mark.parametrize("conv_id", HOSTILE_IDS, ids=repr)
def test_hostile_ids_are_refused(tmp_path, conv_id):
    folder = tmp_path / "home" / "conversations"
    store = ConversationStore(folder)
    (tmp_path / "x.json").write_text("{}")          # what ../x would overwrite or delete
    with pytest.raises(DiffuseError, match="not a conversation id"):
        store.save(Conversation(id=conv_id))
    with pytest.raises(DiffuseError, match="not a conversation id"):
        store.load(conv_id)
    with pytest.raises(DiffuseError, match="not a conversation id"):
        store.delete(conv_id)
    assert (tmp_path / "x.json").read_text() == "{}"
    assert list(folder.iterdir()) == []


def test_safe_ids_round_trip(tmp_path):
    store = ConversationStore(tmp_path)
    for conv_id in ("abc", "A-b_9", "x" * 64, Conversation().id):
        store.save(Conversation(id=conv_id, messages=[Message("user", conv_id)]))
        assert store.load(conv_id).messages[0].text == conv_id
        store.delete(conv_id)
    assert list(tmp_path.iterdir()) == []


# -- a broken recording on the command line -----------------------------------------------------

def test_broken_recording_on_the_command_line_starts_the_app(qtbot, qapp, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QApplication

    from diffuse.studio import __main__ as studio_main
    bad = tmp_path / "RUN.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    restored = []                                 # (window, its status bar's message)
    monkeypatch.setattr(MainWindow, "restore_session",
                        lambda self: restored.append((self, self.statusBar().currentMessage())))

    def exec_then_close(self):                    # the app ran, then its window was closed
        restored[0][0].close()
        return 0
    monkeypatch.setattr(QApplication, "exec", exec_then_close)
    monkeypatch.setattr(studio_main.signal, "signal", lambda *a: None)
    assert studio_main.main([str(bad)]) == 0
    assert len(restored) == 1                     # started as usual, the error reported
    assert "RUN.npz" in restored[0][1]
    assert bad.read_bytes() == b"PK\x03\x04 not really a zip"       # the user's file untouched
