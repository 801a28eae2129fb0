"""The one exception a tool raises on purpose."""


class ToolError(Exception):
    """A tool's answer that the model should see as an error observation (not a crash).

    Its `str` is the message shown to the model, so it names the problem and, where it helps, what to do instead.
    """
