"""rlx-opengl: the RLX backend for OpenGL 4.3+ compute shaders (moderngl on headless EGL)."""

__version__ = "0.1.0"
