"""Conversations on disk: one JSON file each, rewritten atomically after every change.

A message is saved as soon as it is shown (the user's prompt before the run starts, the answer
when the run ends), so a crash loses nothing already on screen. Answers link to the recording
of their run, which lets a restored conversation replay how each answer was denoised.

A conversation is a tree: each message names the one it follows (`parent`), so an edited
question or a regenerated answer starts a branch beside the old one, which is kept. `leaf` is the
last message of the branch on screen. Files from before branches (no ids) load as one branch.
A conversation also keeps its system prompt.

Ids are file names, so only a safe pattern is accepted. A file that cannot be read as a
conversation is moved aside to NAME.bad when the store opens, and the user is told once.
"""
from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from diffuse import DiffuseError
from diffuse.recording import write_atomic
from diffuse.studio import storage


ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_FILE_BYTES = 64 * 2**20         # far more than any chat; a bigger file is not ours
# What answers' meta may hold that the chat panel reads, and the types it needs.
_META_TYPES = {"model": (str,), "recording": (str, type(None)), "options": (dict, type(None)),
               "steps": (int,), "steps_allowed": (int,), "total_ms": (int, float),
               "stop_reason": (str,), "failed": (str,), "left_out": (int,), "system": (str,),
               "arch": (str, type(None))}


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Message:
    role: str                      # "user" | "assistant"
    text: str
    # answers: steps, total_ms, options (the seed included), arch (the model's architecture: how
    # the answer decoded), recording, left_out (oldest messages not in the prompt), system (how the
    # system prompt was sent); a user's message whose run failed: failed (why)
    meta: dict = field(default_factory=dict)
    id: str = field(default_factory=_new_id)
    parent: str | None = None      # the message this one follows; None: a first message


@dataclass
class Conversation:
    id: str = field(default_factory=_new_id)
    title: str = "New conversation"
    created: float = field(default_factory=time.time)
    messages: list[Message] = field(default_factory=list)   # every branch's, oldest first
    system: str = ""               # the system prompt, sent before the turns
    leaf: str | None = None        # the last message of the branch shown; None: the newest

    def __post_init__(self):
        # Messages handed in without a place (a list made by hand) follow each other in order.
        if not any(m.parent for m in self.messages):
            for before, m in zip(self.messages, self.messages[1:]):
                m.parent = before.id

    def branch(self) -> list[Message]:
        """The messages of the branch shown, first to last (a leaf gone: the newest message's)."""
        by_id = {m.id: m for m in self.messages}
        m = by_id.get(self.leaf) or (self.messages or [None])[-1]
        out = []
        while m is not None:
            out.append(m)
            m = by_id.get(m.parent)
        return out[::-1]

    def add(self, message: Message, after: Message | None) -> Message:
        """`message` after `after` (None: as a first message), shown as its branch's end."""
        message.parent = after.id if after is not None else None
        self.messages.append(message)
        self.leaf = message.id
        return message

    def siblings(self, message: Message) -> list[Message]:
        """The messages following the same one as `message` (itself included), oldest first:
        the versions of a question edited, or the answers of one asked again."""
        return [m for m in self.messages if m.parent == message.parent]

    def show(self, message: Message) -> None:
        """Show the branch through `message` that was added to last."""
        under, leaf = {message.id}, message
        for m in self.messages:          # parents come before their children
            if m.parent in under:
                under.add(m.id)
                leaf = m
        self.leaf = leaf.id

    def remove_after(self, message: Message | None) -> None:
        """Drop everything that follows `message` (None: every message), every branch."""
        under, keep = {message.id if message is not None else None}, []
        for m in self.messages:          # parents come before their children
            if m.parent in under:
                under.add(m.id)
            else:
                keep.append(m)
        self.messages = keep
        self.leaf = message.id if message is not None else None

    def chat_messages(self) -> list[dict]:
        """The branch shown as chat-template messages ({role, content}), the system prompt
        first when there is one; a message whose run failed stays on screen but is not sent
        again."""
        system = [{"role": "system", "content": self.system}] if self.system.strip() else []
        return system + [{"role": m.role, "content": m.text} for m in self.branch()
                         if "failed" not in m.meta]

    def to_json(self) -> bytes:
        """The conversation as its file holds it (every branch)."""
        return json.dumps(asdict(self), ensure_ascii=False, indent=1).encode("utf-8")


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or storage.conversations_dir()
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in self.folder.glob("*.json"):     # at start: damaged files aside, told once
            try:
                self.load(path.stem)
            except DiffuseError as e:
                storage.set_aside(path, str(e).removeprefix(f"{path}: "))

    def path(self, conv_id: str) -> Path:
        if not isinstance(conv_id, str) or not ID_PATTERN.fullmatch(conv_id):
            raise DiffuseError(f"{conv_id!r} is not a conversation id (letters, digits, _ and -, "
                               f"at most 64)")
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        if conv.title == "New conversation":
            first = next((m.text for m in conv.messages if m.role == "user"), "")
            if first:
                conv.title = " ".join(first.split())[:60]
        write_atomic(self.path(conv.id), conv.to_json())

    def load(self, conv_id: str) -> Conversation:
        path = self.path(conv_id)
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            return _conversation(conv_id, json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise DiffuseError(f"{path}: no such conversation") from None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            raise DiffuseError(f"{path}: damaged conversation file ({e})") from None

    def list(self) -> list[tuple[str, str]]:
        """(id, title) of every readable conversation, most recently changed first."""
        out = []
        files = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in files:
            try:
                conv = self.load(path.stem)
            except DiffuseError:
                continue
            out.append((conv.id, conv.title))
        return out

    def delete(self, conv_id: str) -> None:
        self.path(conv_id).unlink(missing_ok=True)


def _conversation(conv_id: str, d) -> Conversation:
    """A Conversation from parsed JSON, every field checked; TypeError or ValueError if not."""
    if not isinstance(d, dict):
        raise TypeError("not a JSON object")
    if not isinstance(d.get("title"), str) or not isinstance(d.get("messages"), list):
        raise TypeError("title must be text and messages a list")
    created = d.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        raise TypeError(f"created must be a time, not {created!r}")
    system, leaf = d.get("system", ""), d.get("leaf")
    if not isinstance(system, str) or not isinstance(leaf, (str, type(None))):
        raise TypeError("system must be text and leaf a message id")
    messages, seen = [], set()
    for m in d["messages"]:
        if (not isinstance(m, dict) or m.get("role") not in ("user", "assistant")
                or not isinstance(m.get("text"), str) or not isinstance(m.get("meta", {}), dict)):
            raise TypeError(f"a message must have a role, text and meta: {str(m)[:80]}")
        meta = m.get("meta", {})
        for key, kinds in _META_TYPES.items():
            if key in meta and (not isinstance(meta[key], kinds) or isinstance(meta[key], bool)):
                raise TypeError(f"meta {key} must be {' or '.join(k.__name__ for k in kinds)}")
        if "id" in m:
            mid, parent = m["id"], m.get("parent")
            # a parent is an earlier message: no loops, no dangling branches
            if not isinstance(mid, str) or mid in seen or (parent is not None and parent not in seen):
                raise TypeError(f"message {str(mid)[:40]!r}: a new id after its parent's")
        else:        # a file from before branches: one branch, in order
            mid, parent = _new_id(), messages[-1].id if messages else None
        seen.add(mid)
        messages.append(Message(m["role"], m["text"], meta, mid, parent))
    if leaf not in seen:
        leaf = None          # the newest message
    # The file name is the id: a copied or renamed file keeps working. The messages go in after
    # construction: they are placed already (two first messages are two branches, not a chain).
    conv = Conversation(id=conv_id, title=d["title"], created=float(created), system=system, leaf=leaf)
    conv.messages = messages
    return conv
