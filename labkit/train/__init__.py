"""Supervised training: the schedules, the one update step, the tiny base's pretraining and SFT.

    schedule      the learning-rate schedules and the one clipped update step every run uses
    adam_step     Adam's step against SGD's when the loss is scaled (chapter 6)
    corpus        the tiny base's pretraining corpus, disjoint from the task's problems
    pretrain      pretraining the tiny base, phase 1 (the corpus)
    answer_phase  pretraining the tiny base, phase 2 (answers to statements)
    sft           the warm start and the additional SFT

May import: lab, task, config, models.
"""
