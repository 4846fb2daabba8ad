# Importing the model modules registers them in ript.registry.MODELS.
from ript.models import action_autoencoder, prior  # noqa: F401
