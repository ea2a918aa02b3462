"""Conversations on disk: one JSON file each, rewritten atomically after every change.

A message is saved as soon as it is shown (the user's prompt before the run starts, the answer
when the run ends), so a crash loses nothing already on screen. Answers link to the recording
of their run, which lets a restored conversation replay how each answer was denoised.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from diffuse import DiffuseError
from diffuse.recording import write_atomic
from diffuse.studio import storage


@dataclass
class Message:
    role: str                      # "user" | "assistant"
    text: str
    meta: dict = field(default_factory=dict)   # answers: steps, total_ms, options, recording


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New conversation"
    created: float = field(default_factory=time.time)
    messages: list[Message] = field(default_factory=list)

    def chat_messages(self) -> list[dict]:
        """The turns as chat-template messages ({role, content})."""
        return [{"role": m.role, "content": m.text} for m in self.messages]


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or storage.conversations_dir()
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        if conv.title == "New conversation":
            first = next((m.text for m in conv.messages if m.role == "user"), "")
            if first:
                conv.title = " ".join(first.split())[:60]
        data = json.dumps(asdict(conv), ensure_ascii=False, indent=1).encode("utf-8")
        write_atomic(self.path(conv.id), data)

    def load(self, conv_id: str) -> Conversation:
        path = self.path(conv_id)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return Conversation(id=d["id"], title=d["title"], created=d["created"],
                                messages=[Message(**m) for m in d["messages"]])
        except FileNotFoundError:
            raise DiffuseError(f"{path}: no such conversation") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
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
