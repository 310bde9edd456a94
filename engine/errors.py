"""Errors a person can read: one line naming the file or setting and the problem."""


class LanechatError(Exception):
    """Base for every error the engine reports to a user (CLI exit code 2, a dialog in the app)."""


class ModelError(LanechatError):
    """A model file or folder that cannot be loaded: missing, truncated, lying, unsupported."""


class PlanError(LanechatError):
    """Settings that cannot work: bad values, or a plan that does not fit the memory budget."""


class RequestError(LanechatError):
    """A request the engine refuses before any work (prompt longer than the context, ...)."""


class BackendError(LanechatError):
    """The asked-for compute backend is not usable here."""


class ContextLengthError(RequestError):
    """A prompt that does not fit the context (the OpenAI API names it context_length_exceeded)."""


class StartCancelledError(LanechatError):
    """Engine.start gave up because its caller cancelled the load (Engine.cancel_start)."""


class DeviceLostError(LanechatError):
    """The device's context is lost (a sticky CUDA fault): nothing more can run on it, and the
    engine restarts. Backends say which of their errors are one (`Backend.device_lost`)."""
