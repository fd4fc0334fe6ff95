"""Train a small LoRA adapter for the built-in engine's model and write it as the PEFT files the engine
and the finetunes API load: `edgerun lora train`.

    pairs.py     the question/answer pairs (data/french_qa.json) as chat-template token rows, answer-only labels
    forward.py   a differentiable float32 forward of the engine's weights with LoRA deltas on chosen modules
    train.py     the training loop (AdamW on A and B only, the base frozen) and the job behind the command
    export.py    the trained A/B written as adapter_config.json + adapter_model.safetensors (PEFT)

The model, its weights and tokenizer are the serving engine's (engines.builtin.loader.load_model), read in
float32 as training/eagle3 reads them; the format is contracts.lora_adapter's and the loader that reads
the result engines/builtin/loader/peft.py. The example adapter in data/lora/french/ was made here.
"""
