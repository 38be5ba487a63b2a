"""Fine-tune a Hugging Face encoder with SOL on text ratings: Yelp reviews, 1 to 5 stars.

    pip install 'sol_ext[hf]' datasets
    python examples/hf_text_ratings.py --model distilbert-base-uncased --train-size 20000 --epochs 2

Star ratings are noisy ordinal labels (two readers of one review often differ by a star), which is
what SOL models. The script downloads the checkpoint and the ``yelp_review_full`` data set (labels
0…4 = 1…5 stars), fine-tunes the encoder with :class:`sol_ext.hf.SOLTrainer`, reports the test MAE,
macro-MAE and QWK of the head's ranks, and saves the model. Run it under
``torchrun --nproc-per-node 8 examples/hf_text_ratings.py ...`` for data-parallel training.
"""
from __future__ import annotations

import argparse

from transformers import DataCollatorWithPadding, TrainingArguments

from sol_ext.hf import SOLTextModel, SOLTrainer

NUM_RANKS = 5  # 1 … 5 stars


def build_trainer(encoder, train, test, output_dir: str, epochs: float = 2, batch_size: int = 32,
                  learning_rate: float = 3e-5, sigma: float = 1.0, tokenizer=None, **arguments) -> SOLTrainer:
    """A :class:`SOLTrainer` fine-tuning ``encoder`` (an ``AutoModel``) on ``train``, evaluated on ``test``
    after every epoch; the datasets' rows hold ``input_ids``, ``attention_mask`` and ``labels`` (0…4).
    With a ``tokenizer`` the rows may be of any length: each batch is padded to its longest row
    (``DataCollatorWithPadding``; the attention mask keeps the padding out of the predictions), and the
    tokenizer is saved with the model. ``arguments`` go to ``TrainingArguments``."""
    model = SOLTextModel(encoder, NUM_RANKS, sigma=sigma)
    # ranks 0…4 are named by their stars, which a text-classification pipeline of the saved model gives
    model.config.id2label = {rank: f"{rank + 1} stars" for rank in range(NUM_RANKS)}
    model.config.label2id = {name: rank for rank, name in model.config.id2label.items()}
    args = TrainingArguments(output_dir, num_train_epochs=epochs, per_device_train_batch_size=batch_size,
                             per_device_eval_batch_size=2 * batch_size, learning_rate=learning_rate,
                             weight_decay=0.01, eval_strategy="epoch", save_strategy="epoch",
                             report_to=[], **arguments)
    collator = DataCollatorWithPadding(tokenizer) if tokenizer is not None else None
    return SOLTrainer(model=model, args=args, train_dataset=train, eval_dataset=test, data_collator=collator,
                      processing_class=tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="distilbert-base-uncased", help="a checkpoint on the Hugging Face Hub")
    parser.add_argument("--train-size", type=int, default=20000, help="training reviews (of 650,000)")
    parser.add_argument("--test-size", type=int, default=5000, help="test reviews (of 50,000)")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per review")
    parser.add_argument("--output", default="sol-yelp", help="checkpoints and the final model")
    options = parser.parse_args()

    from datasets import load_dataset  # the example's one extra dependency
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(options.model)
    reviews = load_dataset("yelp_review_full")

    def tokenize(rows):
        return tokenizer(rows["text"], truncation=True, max_length=options.max_length)  # padded per batch

    train = reviews["train"].shuffle(seed=0).select(range(options.train_size)).map(tokenize, batched=True)
    test = reviews["test"].shuffle(seed=0).select(range(options.test_size)).map(tokenize, batched=True)
    trainer = build_trainer(AutoModel.from_pretrained(options.model), train, test, options.output,
                            epochs=options.epochs, tokenizer=tokenizer)
    trainer.train()
    print(trainer.evaluate())  # eval_mae, eval_macro_mae, eval_qwk of the head's ranks (0…4)
    trainer.save_model(options.output)   # config.json, weights and the tokenizer
    # elsewhere: import sol_ext.hf; pipeline("text-classification", model=options.output)(["Great food!"])


if __name__ == "__main__":
    main()
