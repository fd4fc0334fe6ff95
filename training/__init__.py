"""Training what the serving engine loads, apart from it: nothing here is imported while serving.

    eagle3/   EAGLE-3 draft heads for the built-in engine's target model, driven by `edgerun draft`
    lora/     LoRA adapters (PEFT files) for the built-in engine's model, driven by `edgerun lora`
"""
