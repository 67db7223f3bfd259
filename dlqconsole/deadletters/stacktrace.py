"""Read a stack trace (Python, Java/Kotlin, .NET, Go, Node) down to what identifies the failure: the root
exception type and the innermost frames of the application's own code.

Library and runtime frames are skipped (they are shared by every failure that passes through a framework) and
line numbers are dropped (they move with every deploy), so the same bug hit by different messages, different
library paths and different releases gets one signature, while the same exception type thrown from two
different places in the application gets two.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# How many application frames, innermost first, make up a signature: the failing function and its caller.
APP_FRAMES = 2
MAX_TRACE = 60000

PYTHON_HEAD = "Traceback (most recent call last):"
PYTHON_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)', re.M)
PYTHON_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|/usr/lib/python|<frozen |^<")
JAVA_FRAME = re.compile(r"^\s*at ([\w$.<>/`\[\],+-]+)\(([^)]*)\)(?: in (.+?):line \d+)?\s*$")
NODE_FRAME = re.compile(r"^\s*at (?:async )?(?:new )?(?:(.+?) \()?((?:file://)?[^\s()]+?):\d+(?::\d+)?\)?\s*$")
EXCEPTION_LINE = re.compile(r"^(?:Caused by: |Uncaught )?([A-Za-z_$][\w$.+`]*)(?::|\s*$)")
GO_FILE = re.compile(r"^\s+(\S+\.go):\d+")
# Packages whose frames are libraries or the runtime, for the JVM and .NET (matched as prefixes).
JVM_LIBRARIES = (
    "java.",
    "javax.",
    "jakarta.",
    "jdk.",
    "sun.",
    "com.sun.",
    "kotlin.",
    "kotlinx.",
    "scala.",
    "akka.",
    "groovy.",
    "org.springframework.",
    "org.apache.",
    "org.hibernate.",
    "org.eclipse.",
    "org.jboss.",
    "org.glassfish.",
    "org.postgresql.",
    "org.mariadb.",
    "org.mongodb.",
    "org.elasticsearch.",
    "org.slf4j.",
    "org.aspectj.",
    "org.jooq.",
    "org.flywaydb.",
    "org.junit.",
    "org.mockito.",
    "io.netty.",
    "io.grpc.",
    "io.micrometer.",
    "io.opentelemetry.",
    "io.reactivex.",
    "io.vertx.",
    "io.quarkus.",
    "io.undertow.",
    "io.lettuce.",
    "io.github.resilience4j.",
    "reactor.",
    "rx.",
    "com.fasterxml.",
    "com.google.",
    "com.zaxxer.",
    "com.mysql.",
    "com.mongodb.",
    "com.rabbitmq.",
    "com.amazonaws.",
    "software.amazon.",
    "com.microsoft.",
    "com.azure.",
    "redis.clients.",
    "okhttp3.",
    "okio.",
    "retrofit2.",
    "feign.",
    "ch.qos.",
    "net.bytebuddy.",
    "lombok.",
    "graphql.",
    "dev.failsafe.",
    "System.",
    "Microsoft.",
    "Newtonsoft.",
    "MassTransit.",
    "NServiceBus.",
    "Npgsql.",
    "Polly.",
    "RabbitMQ.",
    "StackExchange.",
    "Grpc.",
    "Amazon.",
    "Azure.",
)
GENERATED = re.compile(r"\$\$|\$Proxy|CGLIB|ByteBuddy|<generated>|\.reflect\.|DynamicMethod")
DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class TraceSignature:
    error_type: str
    # Application frames, innermost first, without line numbers.
    frames: tuple[str, ...]

    @property
    def template(self) -> str:
        return f"{self.error_type or 'Error'} in " + " ← ".join(self.frames)


def looks_like_trace(text: str) -> bool:
    """A cheap test for a printed exception with its frames (the message of some services is the whole trace)."""
    if "\n" not in text:
        return False
    return PYTHON_HEAD in text or "\n\tat " in text or "\n    at " in text or "\ngoroutine " in text


def headline(trace: str) -> str:
    """The line that names the exception: for Python the last unindented line, for a Go panic its "panic: " line,
    elsewhere the first line."""
    lines = [line for line in trace[:MAX_TRACE].splitlines() if line.strip()]
    if not lines:
        return ""
    if PYTHON_HEAD in trace:
        for line in reversed(lines):
            if not line[0].isspace() and not line.startswith(PYTHON_HEAD):
                return line.strip()
    for line in lines[:20]:
        if line.startswith("panic: "):
            return line.strip()
    return lines[0].strip()


def signature(trace: str, *, error_type: str = "") -> TraceSignature | None:
    """The signature of a trace, or None when it holds no frame of the application's own code."""
    text = trace[:MAX_TRACE]
    if PYTHON_HEAD in text:
        return _python(text, error_type)
    if "\ngoroutine " in text or text.startswith("goroutine ") or "panic: " in text[:200]:
        return _go(text, error_type)
    return _frames_after_at(text, error_type)


def _short_path(path: str) -> str:
    parts = path.replace("\\", "/").removeprefix("file://").split("/")
    return "/".join(parts[-2:])


def _python(text: str, error_type: str) -> TraceSignature | None:
    # A chained exception prints the root cause first; the root cause is what names the failure, and the
    # following blocks are searched when the root cause holds no application frame (it was raised in a library
    # called from a frame shown in an outer block).
    blocks = text.split(PYTHON_HEAD)[1:]
    root_type = ""
    for position, block in enumerate(blocks):
        frames = [
            f"{_short_path(path)}:{function}"
            for path, function in PYTHON_FRAME.findall(block)
            if not PYTHON_LIBRARY.search(path)
        ]
        kind = _python_exception(block)
        if position == 0:
            root_type = kind
        if frames:
            frames.reverse()
            return TraceSignature(error_type=root_type or kind or error_type, frames=tuple(frames[:APP_FRAMES]))
    return None


def _python_exception(block: str) -> str:
    for line in block.splitlines():
        if line and not line[0].isspace():
            match = EXCEPTION_LINE.match(line)
            if match:
                return match.group(1)
    return ""


def _frames_after_at(text: str, error_type: str) -> TraceSignature | None:
    # JVM (and .NET) traces list the innermost frame first; a "Caused by:" block holds the root cause. Node
    # traces look the same with file paths in place of classes.
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        # Most lines are frames: they are matched before anything else is done with them.
        match = JAVA_FRAME.match(line)
        node = None if match else NODE_FRAME.match(line)
        if match or node:
            frame = _jvm_frame(match.group(1)) if match else _node_frame(node.group(1) or "", node.group(2))  # type: ignore[union-attr]
            if blocks and frame:
                blocks[-1][1].append(frame)
            continue
        stripped = line.strip()
        if not stripped:
            continue
        if not blocks or stripped.startswith("Caused by:"):
            head = EXCEPTION_LINE.match(stripped)
            blocks.append((head.group(1) if head else "", []))
    if not blocks:
        return None
    root_type = blocks[-1][0] or error_type
    for _, frames in reversed(blocks):
        if frames:
            return TraceSignature(error_type=root_type or error_type, frames=tuple(frames[:APP_FRAMES]))
    return None


def clear_cache() -> None:
    """Forget the frames remembered (benchmarks measure the work, not the cache)."""
    _jvm_frame.cache_clear()


# Remembered: a service's traces repeat the same library and application frames.
@functools.lru_cache(maxsize=20000)
def _jvm_frame(qualified: str) -> str:
    name = qualified.rpartition("/")[2] if "/" in qualified else qualified
    if name.startswith(JVM_LIBRARIES) or GENERATED.search(name):
        return ""
    # Lambda and anonymous class numbers change when the code around them changes.
    return DIGITS.sub("N", name)


def _node_frame(function: str, location: str) -> str:
    if "node_modules" in location or location.startswith(("node:", "internal/", "<")) or location == "native":
        return ""
    function = function.removeprefix("async ").strip() or "<anonymous>"
    return f"{_short_path(location)}:{function}"


def _go(text: str, error_type: str) -> TraceSignature | None:
    lines = text.splitlines()
    # Go panics carry no type; the panic message is the fingerprint's message (`headline`).
    kind = error_type
    frames: list[str] = []
    for position, line in enumerate(lines[:-1]):
        location = GO_FILE.match(lines[position + 1])
        if not location or line[:1].isspace() or not line.endswith(")") or "(" not in line:
            continue
        function = line[: line.rfind("(")]
        if function.startswith("created by "):
            continue
        if _go_library(function, location.group(1)):
            continue
        frames.append(function)
        if len(frames) == APP_FRAMES:
            break
    if not frames:
        return None
    return TraceSignature(error_type=kind or "panic", frames=tuple(frames))


def _go_library(function: str, path: str) -> bool:
    if "/pkg/mod/" in path or "/go/src/" in path and "/usr/local/go/" in path or "/vendor/" in path:
        return True
    # The import path ends at the last slash; its first element has a dot for any module outside the standard
    # library ("github.com/acme/shipping/internal/label", but "net/http" and "runtime").
    path_part, slash, rest = function.rpartition("/")
    first = path_part.split("/", 1)[0] if slash else rest.split(".", 1)[0]
    return first != "main" and "." not in first
