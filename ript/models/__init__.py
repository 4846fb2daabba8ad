# Importing the model modules registers them in ript.registry.MODELS.
from ript.models import action_autoencoder, flow, openvla, openvla_oft, pi0, prior, world_model  # noqa: F401
