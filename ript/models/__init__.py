"""The models, each registered in ``ript.registry.MODELS`` by its own module, which is imported when its name is
first asked for: the VLA models bring transformers, which the chunk policy's jobs never load."""

from ript.registry import MODELS

MODELS.declare({"action_autoencoder": "ript.models.action_autoencoder", "skill_prior": "ript.models.prior",
                "flow": "ript.models.flow", "world_model": "ript.models.world_model",
                "openvla": "ript.models.openvla", "openvla_oft": "ript.models.openvla_oft", "pi0": "ript.models.pi0"})
