"""vlaeval: Hydra-configured evaluation of Vision-Language-Action robot policies."""

__version__ = "0.1.0"
