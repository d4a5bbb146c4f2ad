"""quickdraft and other systems: drafters imported from and exported to EAGLE's and Medusa's
checkpoint formats, and the launch configurations of vLLM and SGLang for a method."""
